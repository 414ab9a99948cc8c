"""A command-line program for tests/test_harness.py's check of tfsync_testbed.warmrun: what it
prints and how it exits depend on its argv and environment only."""
import os
import sys
import time


def main():
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


if __name__ == "__main__":
    main()
