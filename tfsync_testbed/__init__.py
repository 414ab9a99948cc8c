"""The test bed that tests and benchmarks share; not part of tfsyncmodes and not installed
with it (importable from a checkout's root: the tests set ``pythonpath = .`` in pytest.ini
and give the processes they start ``PYTHONPATH`` = the repository; benchmarks run as
``python -m benchmarks.NAME`` from there).

- :mod:`~tfsync_testbed.localrun`: local ``horovodrun`` jobs on loopback only, bounded in
  time, nothing left behind;
- :mod:`~tfsync_testbed.netns`: several "hosts" on one machine (network namespaces on a
  private bridge), and :mod:`~tfsync_testbed.ssh`: an ``sshd`` per host for
  ``horovodrun -H``.

``--slow_worker`` fault injection is a feature of the package: :mod:`tfsyncmodes.faults`.
"""
