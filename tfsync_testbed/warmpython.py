"""A Python interpreter for the tests' processes that starts with TensorFlow already imported.

Every rank of a test's ``horovodrun`` job and every task of its gRPC cluster is a process of
its own that spends about 4 s of CPU importing TensorFlow, Keras and Horovod before it does
anything. Here a server imports them once (on two cores the suite then runs in about half the
time); a test's process runs ``warm-python`` (a small client, started in milliseconds) in place
of ``python``.
The client hands the server its arguments, environment, working directory and standard
streams; the server forks a child that enters the client's namespaces (network, host name,
mounts), becomes the program (``python SCRIPT ARGS`` or ``python -m MODULE ARGS``) and exits
with its status, which the client exits with. The child is a real process running the real
program: only the import is shared. It dies with its client: a signal sent to the client is
passed on, and a client that is killed closes the connection the child watches.

The client runs the program cold (``exec python ...``) whenever the server cannot: no server for
its environment's import-time settings (:data:`IMPORT_TIME_VARS`; one server per setting, e.g.
Keras 3 and tf_keras), interpreter options, or a server not yet listening.

    python warmpython.py serve DIR             # a server, for the environment it was started in
    python warmpython.py DIR [python args...]  # the client: what ``warm-python`` runs
    write_launcher(DIR)                        # writes DIR/warm-python and returns its path

The client imports only the standard library. The fork, the hand-over of the streams, the
signals and the status are the package's warm joins (``tfsyncmodes_warm``); this adds a server
per import-time setting started by the tests, and the client's namespaces entered by the child.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import socket
import sys

import tfsyncmodes_warm as warm

# Read while TensorFlow, Keras and Horovod are imported: a server serves one value of each.
IMPORT_TIME_VARS = warm.IMPORT_TIME_VARS
NAMESPACES = ("net", "uts", "mnt")
import_settings = warm.import_settings
exit_status = warm.exit_status


def socket_path(directory: str, env) -> str:
    key = json.dumps(import_settings(env))
    return os.path.join(directory, hashlib.sha1(key.encode()).hexdigest()[:16] + ".sock")


def write_launcher(directory: str) -> str:
    """Writes ``DIR/warm-python``, an executable that runs this client with this interpreter."""
    path = os.path.join(directory, "warm-python")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec '{sys.executable}' '{os.path.abspath(__file__)}' '{directory}' \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def _cold(args):
    os.execv(sys.executable, [sys.executable, *args])


def client(directory: str, args) -> None:
    program = warm.parse_program(args)
    if program is None:
        _cold(args)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path(directory, os.environ))
    except OSError:
        conn.close()
        _cold(args)
    warm.hand_over(conn, program)  # returns only if the server closed before it forked
    _cold(args)


def _enter_namespaces(pid: int) -> None:
    """In the child, before any thread: the client's network, host name and mounts (``ip netns
    exec`` gives a namespace host its own /etc/hosts), where they differ from the server's."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind in NAMESPACES:
        if os.stat(f"/proc/{pid}/ns/{kind}").st_ino == os.stat(f"/proc/self/ns/{kind}").st_ino:
            continue
        fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
        try:
            if libc.setns(fd, 0) != 0:
                raise OSError(ctypes.get_errno(), f"setns into the client's {kind} namespace")
        finally:
            os.close(fd)


def serve(directory: str) -> None:
    # The third-party imports the programs start with, not the package itself: a program may
    # define its own flags before it imports the package, and the order is the program's.
    import tensorflow  # noqa: F401
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        import tf_keras  # noqa: F401
    else:
        import keras  # noqa: F401
    import horovod.tensorflow  # noqa: F401
    parent = os.getppid()
    path = socket_path(directory, os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # listening before its name is there
    warm.serve_forks(listener, lambda busy: os.getppid() != parent, enter=_enter_namespaces)
    os.unlink(path)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 2:
        client(sys.argv[1], sys.argv[2:])
    else:
        sys.exit("usage: warmpython.py serve DIR | warmpython.py DIR [python args]")
