"""A deadline for blocking steps that TensorFlow will otherwise wait on forever.

Some waits happen inside TensorFlow's C++ runtime while it holds the GIL, so no Python thread,
signal handler or timeout runs until they end (``MultiWorkerMirroredStrategy`` waiting for a
worker that never starts ignores even SIGTERM). :func:`deadline` therefore watches from a
small separate process: if the step has not finished in time it prints one clear line and
ends this process with exit status 2, as for any other configuration the user must fix.

How a process stuck in C++ exits with status 2: while the block runs, SIGINT's handler is the
C library's ``_exit`` itself (no Python involved), which the kernel calls with the signal's
number, 2; the watcher sends SIGINT (a Ctrl-C in the block also ends the process at once, with
status 2). A process that does not end within a few seconds of it is killed (SIGKILL). The
watcher ends by itself as soon as the step finishes or this process dies, so it never
outlives its job.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

_WATCHER = r"""
import os, select, signal, sys, time
target, seconds, message, grace = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], float(sys.argv[4])
ready, _, _ = select.select([sys.stdin], [], [], seconds)
if not ready:
    os.write(2, (message + "\n").encode())  # one write: one whole line
    try:
        os.kill(target, signal.SIGINT)  # its handler is _exit: status 2
        for _ in range(int(grace * 10)):
            time.sleep(0.1)
            os.kill(target, 0)
        os.kill(target, signal.SIGKILL)
    except ProcessLookupError:
        pass
"""
KILL_AFTER_S = 5.0


def _exit_on_sigint():
    """Makes SIGINT call the C library's ``_exit(2)``; returns the handler to put back (None
    where the C library cannot be reached: then the watcher's SIGKILL ends the process)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        exit_address = ctypes.cast(libc._exit, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    previous = libc.signal(signal.SIGINT, exit_address)
    return lambda: libc.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def deadline(seconds: float, what: str, fix: str):
    """Ends this process with exit status 2 and one line naming `what` and `fix` unless the
    block finishes within `seconds`."""
    message = f"tfsyncmodes: error: {what} did not finish within {seconds:g}s; {fix}"
    restore = _exit_on_sigint()
    watcher = subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid()), str(seconds), message,
                                str(KILL_AFTER_S)],
                               stdin=subprocess.PIPE)
    try:
        yield
    finally:
        watcher.stdin.close()
        watcher.wait()
        if restore is not None:
            restore()
