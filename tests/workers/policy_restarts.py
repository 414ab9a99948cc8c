"""Drives the straggler policy's two Horovod restarts by hand (every rank at once): a switch to
hybrid with the groups (0, 2) and (1, 3), and back.

    horovodrun -np 4 python policy_restarts.py

Prints one RESULT line per rank: the sets Horovod knew before, during and after the hybrid
phase, the sum over this rank's group during it, the world's sum after, and an allreduce of a
traced function made before the restarts, called after each.
"""
import json
import os
import sys


def main(argv):
    del argv
    import tensorflow as tf

    import tfsyncmodes
    from tfsyncmodes.exchange import groups as groups_lib

    def sets():  # Horovod's own table, by id, the world's left out
        from horovod.tensorflow.mpi_ops import _basics

        return [sorted(r) for i, r in sorted(_basics._get_process_set_ids_and_ranks().items()) if i]

    strategy = tfsyncmodes.make_strategy("sync", switch_policy="straggler")
    hvd = strategy.hvd
    rank = hvd.rank()
    value = tf.constant([float(rank + 1)])

    @tf.function
    def traced(x):  # traced once, over the world's set, as sync's train step is
        return hvd.allreduce(x, op=hvd.Sum, name="traced")

    out = {"rank": rank, "sets": [sets()], "traced": [float(traced(value)[0])]}
    active = strategy.regroup(groups_lib.GroupLayout(((0, 2), (1, 3))))  # a switch to hybrid
    out["sets"].append(sets())
    out["rendezvous"] = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]  # rank 0's store, not horovodrun's
    out["group"] = float(hvd.allreduce(value, op=hvd.Sum, process_set=active.group_set)[0])
    out["traced"].append(float(traced(value)[0]))
    strategy.mode_switched("sync")  # and back
    out["sets"].append(sets())
    out["world"] = float(hvd.allreduce(value, op=hvd.Sum)[0])
    out["traced"].append(float(traced(value)[0]))
    again = strategy.regroup(groups_lib.GroupLayout(((0, 2), (1, 3))))  # the same groups again
    out["rebuilt"] = again is not None
    out["group_again"] = float(hvd.allreduce(value, op=hvd.Sum, process_set=again.group_set)[0])
    # Every rank past its group's sum before any exits: a rank that ends shuts Horovod down for
    # the others, and the other group's sum may still be in flight.
    hvd.allreduce(tf.constant([0.0]), op=hvd.Sum, name="done")
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
