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

The client imports only the standard library.
"""
from __future__ import annotations

import array
import atexit
import ctypes
import hashlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import traceback

# Read while TensorFlow, Keras and Horovod are imported: a server serves one value of each.
IMPORT_TIME_VARS = ("TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH",
                    "CUDA_VISIBLE_DEVICES", "TF_ENABLE_ONEDNN_OPTS")
NAMESPACES = ("net", "uts", "mnt")


def import_settings(env) -> list:
    """`env`'s import-time settings as the import reads them: TF_USE_LEGACY_KERAS only counts as
    true, True or 1 (TensorFlow's test), so "0" is Keras 3 as much as unset is."""
    legacy = env.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")
    return [legacy if name == "TF_USE_LEGACY_KERAS" else env.get(name) for name in IMPORT_TIME_VARS]


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


def exit_status(program) -> int:
    """Runs `program` () and returns the status the interpreter would exit with: a SystemExit's
    code (a message printed to stderr, status 1), or 1 with the traceback printed."""
    try:
        program()
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)
        return 1
    except BaseException:  # what the interpreter does with an exception that escapes
        traceback.print_exc()
        return 1
    return 0


# --- the client ---------------------------------------------------------------------------

def _program(args):
    """``("path", SCRIPT, rest)`` or ``("module", NAME, rest)``, or None for anything else."""
    if len(args) >= 2 and args[0] == "-m":
        return "module", args[1], args[2:]
    if args and not args[0].startswith("-"):
        return "path", args[0], args[1:]
    return None


def _cold(args):
    os.execv(sys.executable, [sys.executable, *args])


def client(directory: str, args) -> None:
    program = _program(args)
    if program is None:
        _cold(args)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path(directory, os.environ))
    except OSError:
        conn.close()
        _cold(args)
    request = json.dumps({"kind": program[0], "name": program[1], "args": program[2],
                          "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    conn.sendmsg([struct.pack("!I", len(request)), request],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    reader = conn.makefile("r")
    line = reader.readline()
    if not line.strip():  # the server closed before it forked: nothing of the program ran
        conn.close()
        _cold(args)
    child = int(line)

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(signum, forward)
    line = reader.readline()
    status = int(line) if line.strip() else 1
    if status < 0:  # killed by a signal: die of it too, as the program did
        if -status not in (signal.SIGKILL, signal.SIGSTOP):  # these two have no handler to reset
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)


# --- the server ---------------------------------------------------------------------------

def _receive(conn):
    fds = array.array("i")
    header, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    (size,) = struct.unpack("!I", header)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise EOFError("client left")
        body += chunk
    return json.loads(body), list(fds)


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


def _watch(conn) -> None:
    """In the child: the client's end closed means the client is gone; so is the program."""
    while True:
        try:
            if not conn.recv(1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os.kill(os.getpid(), signal.SIGKILL)


def _become(request, fds, conn, client_pid) -> None:
    """In the child: never returns."""
    code = 1
    try:
        for fd, target in zip(fds, (0, 1, 2)):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.setsid()
        _enter_namespaces(client_pid)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        threading.Thread(target=_watch, args=(conn,), daemon=True).start()
        name = request["name"]
        sys.argv = [name, *request["args"]]
        if request["kind"] == "module":
            sys.path[0] = os.getcwd()
            code = exit_status(lambda: runpy.run_module(name, run_name="__main__", alter_sys=True))
        else:
            sys.path[0] = os.path.dirname(os.path.realpath(name))
            code = exit_status(lambda: runpy.run_path(name, run_name="__main__"))
        threading._shutdown()  # what the interpreter does at its end: join threads, then atexit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


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
    clients = {}
    while os.getppid() == parent:
        ready, _, _ = select.select([listener], [], [], 0.05)
        if ready:
            conn, _ = listener.accept()
            try:
                client_pid = struct.unpack("3i", conn.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
                request, fds = _receive(conn)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in clients.values():
                    other.close()
                _become(request, fds, conn, client_pid)
            for fd in fds:
                os.close(fd)
            try:
                conn.sendall(f"{pid}\n".encode())
            except OSError:
                pass
            clients[pid] = conn
        while clients:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            conn = clients.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()
    os.unlink(path)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 2:
        client(sys.argv[1], sys.argv[2:])
    else:
        sys.exit("usage: warmpython.py serve DIR | warmpython.py DIR [python args]")
