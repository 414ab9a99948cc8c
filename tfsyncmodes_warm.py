"""Warm joins: the ranks of a Horovod job start with TensorFlow already imported.

    horovodrun --min-np 2 --max-np 4 --host-discovery-script ./discover.sh \\
        python -m tfsyncmodes_warm scripts/train.py --sync_elastic ...
    horovodrun ... python -m tfsyncmodes_warm -m my_package.train ...     # a module

A rank that comes back in an elastic job is a new process, and the world waits for it at
Horovod's rendezvous while it imports TensorFlow, Keras and Horovod. Here the first process of
a job on a host starts a server that imports them once; every rank of the job on that host is a
child forked from it that runs the program from its first line (``python SCRIPT ARGS`` or
``python -m MODULE ARGS``) in the launched process's environment, working directory and
standard streams. The launched process stays as its stand-in: it passes signals on and exits
with the child's status, and the child dies when it does. In the child, ``sys.orig_argv`` is
the command that runs the program again through this module.

The server is found by a name made of the job's rendezvous (``HOROVOD_GLOO_RENDEZVOUS_ADDR`` and
``PORT``), the interpreter and the settings read at import (:data:`IMPORT_TIME_VARS`), in the
abstract socket namespace (no file). It leaves when it has no child and the job's rendezvous no
longer answers, or after ``TFSYNC_WARM_IDLE`` seconds (60) with no child. Outside
``horovodrun``, with interpreter options, or when the server cannot start, the program runs as
``python`` runs it. The client imports the standard library only (the package's ``__init__``
imports TensorFlow, hence a module of its own); the server initialises no device, so each child
still chooses its own GPU.
"""
from __future__ import annotations

import array
import atexit
import hashlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback

# Read while TensorFlow, Keras and Horovod are imported: a server serves one value of each.
IMPORT_TIME_VARS = ("TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH", "CUDA_VISIBLE_DEVICES",
                    "TF_ENABLE_ONEDNN_OPTS", "TF_XLA_FLAGS")
START_TIMEOUT = 300.0  # seconds a client waits for a new server to accept it
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _legacy_keras(env) -> bool:
    return env.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")


def import_settings(env) -> list:
    """`env`'s import-time settings as the import reads them: TF_USE_LEGACY_KERAS only counts as
    true, True or 1 (TensorFlow's test), so "0" is Keras 3 as much as unset is."""
    return [_legacy_keras(env) if name == "TF_USE_LEGACY_KERAS" else env.get(name) for name in IMPORT_TIME_VARS]


def server_name(env) -> str | None:
    """The abstract socket name of `env`'s server, or None outside a ``horovodrun`` job."""
    addr, port = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"), env.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if not addr or not port:
        return None
    key = json.dumps([os.getuid(), sys.executable, addr, port, import_settings(env)])
    return "\0tfsyncmodes-warm-" + hashlib.sha1(key.encode()).hexdigest()[:20]


def parse_program(args):
    """``("path", SCRIPT, rest)`` or ``("module", NAME, rest)``; None for interpreter options."""
    if len(args) >= 2 and args[0] == "-m":
        return "module", args[1], args[2:]
    if args and not args[0].startswith("-"):
        return "path", args[0], args[1:]
    return None


def _cold(args, why: str = "") -> None:
    if why:
        print(f"tfsyncmodes_warm: {why}; starting without a warm server", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, *args])


def _connect(name: str):
    """A connection to the server `name`, started first if none answers (None: it did not start)."""
    deadline = time.monotonic() + START_TIMEOUT
    started = None
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(name)
            return conn
        except OSError:
            conn.close()
        if started is None:
            started = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--serve"], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        elif started.poll() is not None and started.returncode != 0:
            return None  # it failed before it listened; a server another rank started exits 0
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def _idle_seconds(env):
    """``TFSYNC_WARM_IDLE`` (60 when unset) in seconds, None when it is not a number > 0."""
    try:
        idle = float(env.get("TFSYNC_WARM_IDLE", "60"))
    except ValueError:
        return None
    return idle if idle > 0 and idle != float("inf") else None


def client(args) -> None:
    """Runs ``python ARGS`` as a child of this job's server on this host; never returns."""
    program = parse_program(args)
    if not args:
        print("tfsyncmodes_warm: no program given; fix: python -m tfsyncmodes_warm SCRIPT [ARGS] "
              "or python -m tfsyncmodes_warm -m MODULE [ARGS]", file=sys.stderr)
        sys.exit(2)
    if _idle_seconds(os.environ) is None:
        print(f"tfsyncmodes_warm: TFSYNC_WARM_IDLE={os.environ['TFSYNC_WARM_IDLE']!r} is not a number of "
              "seconds; fix: a number > 0, e.g. TFSYNC_WARM_IDLE=60", file=sys.stderr)
        sys.exit(2)
    name = server_name(os.environ)
    if program is None or name is None:
        _cold(args)
    conn = _connect(name)
    if conn is None:
        _cold(args, "the warm server did not start")
    hand_over(conn, program)
    _cold(args, "the warm server closed")


def hand_over(conn, program) -> None:
    """Asks the server at `conn` to run `program` (:func:`parse_program`'s triple) with this process's
    environment, working directory and standard streams, passes signals on to the child and exits
    with its status. Returns only if the server closed before it forked: nothing of the program
    ran."""
    request = json.dumps({"kind": program[0], "name": program[1], "args": program[2],
                          "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    conn.sendmsg([struct.pack("!I", len(request)), request],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    reader = conn.makefile("r")
    line = reader.readline()
    if not line.strip():
        conn.close()
        return
    child = int(line)

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    line = reader.readline()
    status = int(line) if line.strip() else 1
    if status < 0:  # killed by a signal: die of it too, as the program did
        if -status not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)


# --- the server: one per job, interpreter and import settings on a host --------------------

def receive(conn):
    """(request, the client's three standard streams' descriptors) from a client's connection."""
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


def exit_status(program) -> int:
    """Runs `program` () and returns the status the interpreter would exit with."""
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


def become(request, fds, conn, enter=None) -> None:
    """In the child: becomes the program; never returns. `enter` () runs once the child has its
    own session, before it moves to the client's working directory."""
    code = 1
    try:
        for fd, target in zip(fds, (0, 1, 2)):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.setsid()
        if enter is not None:
            enter()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        threading.Thread(target=_watch, args=(conn,), daemon=True).start()
        name = request["name"]
        sys.argv = [name, *request["args"]]
        # The command that runs the program again warm (what a rank's step deadline re-runs).
        sys.orig_argv = [sys.executable, "-m", "tfsyncmodes_warm",
                         *(["-m"] if request["kind"] == "module" else []), name, *request["args"]]
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


def serve_forks(listener, stop, enter=None) -> None:
    """Forks a child per client of `listener` that becomes the client's program, and tells each
    client its child's pid and then its status, until `stop(busy)` (busy: a child is running)
    is true. `enter(client_pid)`, if given, runs in each child (see :func:`become`)."""
    clients = {}
    while not stop(bool(clients)):
        ready, _, _ = select.select([listener], [], [], 0.05)
        if ready:
            conn, _ = listener.accept()
            try:
                client_pid = struct.unpack("3i", conn.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
                request, fds = receive(conn)
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
                become(request, fds, conn, None if enter is None else (lambda: enter(client_pid)))
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


def _answers(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), timeout=1.0).close()
        return True
    except OSError:
        return False


def serve() -> None:
    """Binds this environment's name (or returns: another rank's server has it), imports, and
    serves until it has had no child for ``TFSYNC_WARM_IDLE`` seconds or has none and the job's
    rendezvous no longer answers."""
    name = server_name(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(name)
    except OSError:
        return
    listener.listen(128)  # clients that connect during the imports wait in the backlog
    # The imports programs start with, not this package: a program may define its own flags
    # before it imports tfsyncmodes, and the order is the program's.
    import tensorflow  # noqa: F401
    if _legacy_keras(os.environ):
        import tf_keras  # noqa: F401
    else:
        import keras  # noqa: F401
    try:
        import horovod.tensorflow  # noqa: F401
    except ImportError:
        pass
    rendezvous = (os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"], int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]))
    idle = _idle_seconds(os.environ)
    clock = {"child": time.monotonic(), "checked": 0.0}

    def stop(busy: bool) -> bool:
        now = time.monotonic()
        if busy:
            clock["child"] = now
            return False
        if now - clock["child"] > idle:
            return True
        if now - clock["checked"] > 0.1:  # a connect on the job's network: cheap
            clock["checked"] = now
            return not _answers(*rendezvous)
        return False

    serve_forks(listener, stop)


def main(argv=None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--serve"]:
        serve()
        return
    client(args)


if __name__ == "__main__":
    main()
