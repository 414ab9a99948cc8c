"""The launcher's options (``python -m tfsyncmodes.launch --help``), parsed and checked: every
bad value is one line naming the option, the problem and the fix, exit status 2.

Like the launcher, this module imports nothing from the package (so not TensorFlow); the
launcher loads it by path.
"""
from __future__ import annotations

import argparse
import math
import shutil
import sys
from typing import List


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input as one line (source, field, problem, fix) with exit
    status 2, as the rest of tfsyncmodes does, instead of its usage text."""

    def error(self, message: str):
        field, problem = "options", message
        if message.startswith("argument "):
            field, _, problem = message[len("argument "):].partition(": ")
            field = field.split("/")[-1]
        elif message.startswith(("unrecognized arguments: ", "ambiguous option: ")):
            field = message.split(": ", 1)[1].split()[0].split("=")[0]
            problem = "is not an option of the launcher" if message[0] == "u" else message.split(": ", 1)[1]
        problem = problem.replace("expected one argument", "needs a value")
        problem = problem.replace("ignored explicit argument", "takes no value, got")
        _fail(field, problem, "see python -m tfsyncmodes.launch --help; the command goes after --")


def _fail(field: str, problem: str, fix: str):
    sys.stderr.write(f"tfsyncmodes: error: launch: {field}: {problem}; {fix}\n")
    sys.stderr.flush()
    sys.exit(2)


def _count(text: str) -> int:
    """A whole number of tasks (the range is checked with the other options)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0 (0: no limit)")
    return value


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = _Parser(
        prog="python -m tfsyncmodes.launch",
        description="Run a command in every task of a local chief/worker/ps cluster on 127.0.0.1.")
    parser.add_argument("--workers", type=_count, default=2, help="worker tasks (default 2)")
    parser.add_argument("--ps", type=_count, default=1, help="parameter server tasks (default 1)")
    parser.add_argument("--timeout", type=_seconds, default=None,
                        help="stop the whole cluster after this many seconds (default: no limit)")
    parser.add_argument("--tolerate_worker_loss", action="store_true",
                        help="keep going when a worker dies (async mode reschedules its steps)")
    parser.add_argument("--max_restarts", type=_count, default=0,
                        help="restart a worker that dies, at its address, up to this many times each; and "
                             "restart the whole cluster when a ps or the chief dies (the chief resumes from "
                             "its last backup), up to this many times (default 0: no restarts)")
    parser.add_argument("--share_network", action="store_true",
                        help="run the tasks in this machine's network instead of a private loopback-only "
                             "one (their ports are then reachable from the network)")
    parser.add_argument("--print-tf-config", dest="print_tf_config", action="store_true",
                        help="start nothing; print each task's TF_CONFIG for a cluster over --hosts")
    parser.add_argument("--hosts", default=None, help="with --print-tf-config: comma-separated host names "
                                                      "or addresses (the chief goes on the first)")
    parser.add_argument("--port", type=_count, default=None,
                        help="with --print-tf-config: first port on each host (default 2222)")
    parser.add_argument("--np", type=int, default=None,
                        help="with --sync_mode_schedule through async: horovodrun ranks of the sync and hybrid "
                             "phases (default: --workers)")
    parser.add_argument("--phase_dir", default="",
                        help="with --sync_mode_schedule through async: where the phases' checkpoints and plan "
                             "are kept (default: a temporary directory, removed at the end)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- command to run in every task")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.workers < 1:
        _fail("--workers", f"{args.workers} is too few", "use 1 or more")
    if args.ps < 0:
        _fail("--ps", f"{args.ps} is negative", "use 0 or more")
    if args.max_restarts < 0:
        _fail("--max_restarts", f"{args.max_restarts} is negative", "use 0 (no restarts) or more")
    if args.print_tf_config:
        _check_print_tf_config(args)
        return args
    for given, name in ((args.hosts is not None, "--hosts"), (args.port is not None, "--port")):
        if given:
            _fail(name, "is only used with --print-tf-config (a local cluster takes free ports on 127.0.0.1)",
                  f"drop {name}, or add --print-tf-config")
    if not args.command:
        _fail("command", "missing", "give it after --, e.g. -- python scripts/train.py --sync_mode=async")
    if shutil.which(args.command[0]) is None:
        _fail("command", f"{args.command[0]!r} is not a program that can be run (not found, or not executable)",
              "name an executable or its path, e.g. -- python scripts/train.py")
    args.timeout = args.timeout or 0.0
    return args


def _check_print_tf_config(args: argparse.Namespace) -> None:
    """--print-tf-config starts nothing: hosts and port must make a cluster; options for a
    running cluster are refused rather than ignored."""
    running = [name for given, name in ((args.timeout is not None, "--timeout"),
                                        (args.tolerate_worker_loss, "--tolerate_worker_loss"),
                                        (args.max_restarts > 0, "--max_restarts"),
                                        (args.share_network, "--share_network"), (bool(args.command), "command"))
               if given]
    if running:
        _fail(running[0], "acts on a running cluster, and --print-tf-config starts none",
              f"drop {running[0]}, or drop --print-tf-config to start a local cluster")
    # Checked here, without the package: run as a file, the launcher imports no TensorFlow.
    text = args.hosts or ""
    hosts = [h.strip() for h in text.split(",")]
    if not text.strip() or not all(hosts):
        _fail("--hosts", f"{text!r} names no host or an empty one", "give e.g. --hosts 10.0.0.1,10.0.0.2")
    bad = [h for h in hosts if ":" in h or " " in h or "'" in h]
    if bad:
        _fail("--hosts", f"{bad[0]!r} is not a host name or IPv4 address",
              "give names without ports (--port sets the first port)")
    if len(set(hosts)) != len(hosts):
        _fail("--hosts", f"{text!r} names a host twice", "name each host once")
    args.hosts, args.port = hosts, 2222 if args.port is None else args.port
    tasks = args.workers + args.ps + 1
    if not 1 <= args.port <= 65535 - tasks:
        _fail("--port", f"{args.port} is out of range for {tasks} tasks on one host", "use 1024..60000")
