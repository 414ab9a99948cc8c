"""A user script that starts Horovod itself before asking for the straggler policy.

    horovodrun -np 2 python policy_after_user_init.py [dynamic]

Without ``dynamic`` it calls ``hvd.init()`` (no dynamic process sets) and the policy refuses
at the start, one line; with it, ``hvd.init(process_sets="dynamic")`` and the strategy is made.
"""
import sys


def main(argv):
    import horovod.tensorflow as hvd

    hvd.init(process_sets="dynamic") if "dynamic" in argv else hvd.init()
    import tfsyncmodes

    strategy = tfsyncmodes.make_strategy("sync", switch_policy="straggler")
    print(f"RESULT rank {hvd.rank()} mode {strategy.mode}", flush=True)


if __name__ == "__main__":
    from tfsyncmodes.errors import run

    run(lambda argv: main(sys.argv[1:]))
