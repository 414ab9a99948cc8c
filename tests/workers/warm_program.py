"""A command-line program for tests/test_harness.py's checks of tfsync_testbed.warmrun and
tfsync_testbed.warmpython: what it prints and how it exits depend on its argv, environment,
working directory, standard input and network namespace only. Its first line of stderr says
whether TensorFlow was imported before it started (a warm interpreter)."""
import os
import socket
import sys
import time


def main():
    print(f"warm={'tensorflow' in sys.modules}", file=sys.stderr, flush=True)
    action, *rest = sys.argv[1:]
    print(f"argv {sys.argv}", flush=True)
    print(f"WARM_VALUE={os.environ.get('WARM_VALUE')}", file=sys.stderr)
    if action == "exit":
        sys.exit(int(rest[0]))
    if action == "message":
        sys.exit(" ".join(rest))
    if action == "raise":
        raise ValueError("the program failed")
    if action == "sleep":
        time.sleep(float(rest[0]))
    if action == "hold":
        print(f"pid {os.getpid()}", flush=True)
        time.sleep(float(rest[0]))
    if action == "where":
        print(f"cwd {os.getcwd()}\npath0 {sys.path[0]}\nfile {__file__}\nname {__name__}\n"
              f"executable {sys.executable}\nnetwork {[name for _, name in socket.if_nameindex()]}\n"
              f"stdin {sys.stdin.read()!r}")


if __name__ == "__main__":
    main()
