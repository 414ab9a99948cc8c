"""Helpers the benchmark scripts share (importing one benchmark would define its flags)."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Mapping, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
TRAIN = os.path.join(REPO, "scripts", "train.py")


def repo_env(base: Optional[Mapping[str, str]] = None, **extra: str) -> dict:
    """`base` (default: this process's environment) with the repository first on PYTHONPATH,
    plus `extra`: the environment of every process a benchmark starts, so that it imports
    ``benchmarks``, ``tfsync_testbed`` and ``tfsyncmodes`` from this checkout."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                  if p and p != REPO])
    env.update(extra)
    return env


def module_command(module: str, *args: str) -> list:
    """``python -m module args``: how a benchmark starts one of its own modules as a process
    (with :func:`repo_env`)."""
    return [sys.executable, "-m", module, *args]


def async_chief_run(program: str, module: str, workers: int, args: Sequence[str], timeout: int) -> dict:
    """Runs `module` (``--chief_out=FILE`` and `args`) as the chief of a fresh local async
    cluster (``tfsyncmodes.launch``, 1 ps, `workers` workers) and returns the JSON it wrote to
    FILE; a cluster that fails prints its output's tail and exits naming `program`."""
    from tfsync_testbed import localrun

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "chief.json")
        command = [sys.executable, "-m", "tfsyncmodes.launch", "--workers", str(workers), "--ps", "1",
                   "--timeout", str(timeout), "--", *module_command(module), f"--chief_out={out}", *args]
        # One thread per op keeps processes from fighting over the cores; inter-op parallelism
        # stays (a single inter-op thread deadlocks the workers' remote functions).
        env = repo_env(TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1")
        result = localrun.run(command, timeout=timeout + 100, env=env, cwd=REPO)
        if result.returncode != 0 or not os.path.exists(out):
            sys.stderr.write(result.stdout[-5000:])
            sys.exit(f"{program}: the cluster with {workers} worker(s) failed ({result.returncode})")
        with open(out, encoding="utf-8") as handle:
            return json.load(handle)


def flag_value(words: str, flag: str, default: int) -> int:
    """The whole number a trainer would take for `flag` (e.g. ``--seed``) from the space-separated
    `words` (a bed's ``--extra_flags``): its last ``--flag=N`` or ``--flag N``, as absl takes
    it; `default` when none is given."""
    value, words = default, words.split()
    for i, word in enumerate(words):
        if word.startswith(flag + "="):
            value = int(word.split("=", 1)[1])
        elif word == flag and i + 1 < len(words):
            value = int(words[i + 1])
    return value


def bad_flag(program: str, field: str, problem: str, fix: str) -> None:
    """One line naming the flag, what is wrong and the fix, and exit status 2."""
    sys.stderr.write(f"{program}: error: flag: --{field}: {problem}; {fix}\n")
    sys.exit(2)


def check_bed_counts(program: str, values, ranks=(2, 4, 8)) -> None:
    """The bed's ranks (one of `ranks`), repeats and epochs (1 or more) from absl `values`."""
    if values.ranks not in ranks:
        bad_flag(program, "ranks", f"{values.ranks} is not accepted", "use " + ", ".join(map(str, ranks[:-1]))
                 + f" or {ranks[-1]}")
    for name in ("repeats", "epochs"):
        if values[name].value < 1:
            bad_flag(program, name, f"{values[name].value} is too small", "use 1 or more")


def replace_section(path: str, name: str, text: str) -> None:
    """Writes `text` between benchmark `name`'s markers in `path`, leaving other sections alone."""
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    content = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmarks\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in content and end in content:
        content = content[:content.index(begin)] + block + content[content.index(end) + len(end):]
    else:
        content = content.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(content)


def _horovod_job(name: str, num_proc: int, command: list, out: str, timeout: float) -> object:
    """Runs `command` as the ranks of one ``horovodrun -np num_proc`` job (loopback only, killed on
    timeout, no ``TFSYNC_*`` of this process) and returns the JSON the job wrote to `out`. Exits
    with a message naming `name` if the job fails."""
    import json

    from tfsync_testbed import localrun

    env = {k: v for k, v in os.environ.items() if not k.startswith("TFSYNC_")}
    result = localrun.run(localrun.horovodrun_command(num_proc, command), timeout=timeout,
                          env=repo_env(env, TF_CPP_MIN_LOG_LEVEL="2"), cwd=REPO)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-3000:] + result.stderr[-5000:])
        sys.exit(f"{name}: the horovodrun job failed with status {result.returncode}")
    with open(out, encoding="utf-8") as handle:
        return json.load(handle)


def run_ranks(name: str, num_proc: int, module: str, flags: list, timeout: float) -> object:
    """Runs `module` (``python -m``) with `flags` as the ranks of one ``horovodrun -np num_proc``
    job, passing ``--worker_out=FILE``, and returns the JSON that rank 0 wrote there."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        return _horovod_job(name, num_proc, module_command(module, f"--worker_out={out}", *flags), out, timeout)


def train_metrics(name: str, num_proc: int, flags: list, timeout: float) -> dict:
    """Runs ``scripts/train.py`` with `flags` under ``horovodrun -np num_proc`` (a model
    directory and metrics file of its own) and returns the chief's metrics."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.json")
        command = [sys.executable, TRAIN, f"--model_dir={os.path.join(tmp, 'run')}", f"--metrics_file={metrics}",
                   *flags]
        return _horovod_job(name, num_proc, command, metrics, timeout)


def rounds_cell(rounds, name: str, over: Optional[str] = None) -> tuple:
    """(median, low, high) of call `name`'s seconds over interleaved `rounds` ({call: seconds}
    each), in ms; with `over`, of its ratio to call `over` taken within each round."""
    import statistics

    values = [r[name] / r[over] if over else 1000 * r[name] for r in rounds]
    return statistics.median(values), min(values), max(values)


def rounds_text(triple, digits: int = 3) -> str:
    """A :func:`rounds_cell` as ``median [low-high]``."""
    median, low, high = triple
    return f"{median:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"
