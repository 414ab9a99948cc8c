"""The benchmarks (results in docs/BENCHMARKS.md and docs/*.json); not installed with tfsyncmodes.

Run each from the repository's root as a module, e.g. ``python -m benchmarks.bench_sync``.
The processes a benchmark starts (its own ranks, ``scripts/train.py``) get ``PYTHONPATH`` =
the repository from :func:`benchmarks.benchlib.repo_env`; its ranks run as modules too
(:func:`benchmarks.benchlib.module_command`). Local jobs use the test bed in
``tfsync_testbed/`` (loopback only; network namespaces for the multi-host benchmark).
"""
