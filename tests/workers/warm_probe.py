"""Run by every rank of a ``horovodrun`` job through ``python -m tfsyncmodes_warm``: prints one
RESULT line with what the process had before its first line (the modules a warm server imported),
its parent's command line, its arguments, working directory and one variable of the launched
process's environment, then exits with the status its arguments give its rank.

    python -m tfsyncmodes_warm warm_probe.py STATUS_OF_RANK_0 STATUS_OF_RANK_1 ...
"""
import json
import os
import sys

PREIMPORTED = sorted(m for m in ("tensorflow", "keras", "tf_keras", "horovod.tensorflow") if m in sys.modules)


def main(argv):
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as handle:
            parent_command = [word.decode() for word in handle.read().split(b"\0") if word]
    except OSError:
        parent_command = []
    print("RESULT " + json.dumps({
        "rank": rank, "pid": os.getpid(), "parent": parent, "parent_command": parent_command,
        "preimported": PREIMPORTED, "argv": argv, "cwd": os.getcwd(), "mark": os.environ.get("WARM_PROBE_MARK"),
        "main": __name__}), flush=True)
    sys.exit(int(argv[rank]) if len(argv) > rank else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
