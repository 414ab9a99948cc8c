"""A deadline for blocking steps that TensorFlow will otherwise wait on forever.

Some waits happen inside TensorFlow's C++ runtime while it holds the GIL, so no Python thread,
signal handler or timeout runs until they end (``MultiWorkerMirroredStrategy`` waiting for a
worker that never starts ignores even SIGTERM). :func:`deadline` therefore watches from a
small separate process: if the step has not finished in time it prints one clear message and
kills this process. The watcher ends by itself as soon as the step finishes or this process
dies, so it never outlives its job.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys

_WATCHER = r"""
import os, select, signal, sys
target, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ready, _, _ = select.select([sys.stdin], [], [], seconds)
if not ready:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os.kill(target, signal.SIGKILL)
"""


@contextlib.contextmanager
def deadline(seconds: float, what: str, fix: str):
    """Kills this process with a message naming `what` and `fix` unless the block finishes
    within `seconds`."""
    import os

    message = f"tfsyncmodes: error: {what} did not finish within {seconds:g}s; {fix}"
    watcher = subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid()), str(seconds), message],
                               stdin=subprocess.PIPE)
    try:
        yield
    finally:
        watcher.stdin.close()
        watcher.wait()
