"""Many short runs of one command-line program, each a process of its own, sharing one import.

The bad-input tests run the example trainer dozens of times to see it refuse an argument; each
run spends about 5 s importing TensorFlow before it prints its one line. Here one process
imports the program once, then forks a child per case: the child takes the case's argv and
environment, runs the program's entry point, and exits as the program would (its status, its
stdout and stderr, a traceback printed if an exception escapes). Cases whose environment
changes what the import itself reads (``IMPORT_TIME_VARS``) are refused: run those as their
own processes.

    results = warmrun.run_cases("tfsyncmodes.examples.train:main", cases, env=..., cwd=..., timeout=60)

Driver: ``python -m tfsync_testbed.warmrun ENTRY`` reads the cases as JSON on stdin and writes
the results as JSON on stdout.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Mapping, Sequence

from tfsync_testbed import localrun, warmpython

# Read while TensorFlow and Keras are imported: a case cannot change them.
IMPORT_TIME_VARS = warmpython.IMPORT_TIME_VARS


def run_cases(entry: str, cases: Sequence[Mapping], *, env: Mapping[str, str], cwd: str,
              timeout: float) -> List[subprocess.CompletedProcess]:
    """Runs ``entry`` ("module:function") once per case ({"argv": [...], "env": {...}}: the
    case's environment is `env` updated by its own) and returns a ``CompletedProcess`` for each,
    in order; a case still running after `timeout` seconds is killed and its ``returncode`` is
    ``"timeout"``. The whole batch is bounded by the sum of the cases' timeouts."""
    for case in cases:
        changed = [k for k in IMPORT_TIME_VARS if k in case.get("env", {}) and case["env"][k] != env.get(k)]
        if changed:
            raise ValueError(f"case {case['argv']}: {changed} are read at import; run it as its own process")
    payload = json.dumps({"cases": [{"argv": list(c["argv"]), "env": {**env, **c.get("env", {})}}
                                    for c in cases], "timeout": timeout})
    driver = localrun.run([sys.executable, "-m", "tfsync_testbed.warmrun", entry], env=env, cwd=cwd,
                          timeout=60 + timeout * len(cases), input=payload)
    if driver.returncode != 0:
        raise RuntimeError(f"warmrun driver failed ({driver.returncode}): {driver.stderr[-3000:]}")
    return [subprocess.CompletedProcess(c["argv"], r["returncode"], r["stdout"], r["stderr"])
            for c, r in zip(cases, json.loads(driver.stdout))]


def _child(function, case: Mapping, out: int, err: int) -> None:
    """Never returns: runs the program as ``python -m`` would and exits with its status."""
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.environ.clear()
    os.environ.update(case["env"])
    sys.argv = list(case["argv"])
    try:
        code = warmpython.exit_status(function)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _one(function, case: Mapping, timeout: float) -> Dict:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(function, case, out.fileno(), err.fileno())
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                returncode = "timeout"
                break
            time.sleep(0.02)
        out.seek(0)
        err.seek(0)
        return {"returncode": returncode, "stdout": out.read().decode("utf-8", "replace"),
                "stderr": err.read().decode("utf-8", "replace")}


def main(argv: Sequence[str]) -> None:
    module, _, name = argv[1].partition(":")
    request = json.load(sys.stdin)
    function = getattr(importlib.import_module(module), name)
    results = [_one(function, case, request["timeout"]) for case in request["cases"]]
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main(sys.argv)
