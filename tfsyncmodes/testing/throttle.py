"""Straggler emulation for a whole process: run it only 1/FACTOR of the time.

In async mode the work of a step happens inside a worker's TensorFlow server, where no Keras
callback runs; ``--sync_slow_worker=INDEX:FACTOR`` therefore slows that worker process itself, as a
slower machine would: a small watcher pauses it (SIGSTOP) for ``1 - 1/FACTOR`` of every 50 ms
and resumes it (SIGCONT) for the rest. The watcher ends as soon as the process is gone.
"""
from __future__ import annotations

import os
import subprocess
import sys

PERIOD_SECONDS = 0.05

_WATCHER = r"""
import os, signal, sys, time
target, run_fraction, period = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
while True:
    try:
        time.sleep(period * run_fraction)
        os.kill(target, signal.SIGSTOP)
        time.sleep(period * (1.0 - run_fraction))
        os.kill(target, signal.SIGCONT)
    except ProcessLookupError:
        break
"""


def throttle_self(factor: float) -> subprocess.Popen:
    """Starts the watcher that slows this process down `factor` times."""
    return subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid()), str(1.0 / factor),
                             str(PERIOD_SECONDS)], stdin=subprocess.DEVNULL)
