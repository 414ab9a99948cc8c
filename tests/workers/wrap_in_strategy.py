"""A user's script that parses its own arguments with argparse (no absl.app), makes the
strategy from the command line and wraps without naming a mode. Prints one JSON line per rank.

    horovodrun -np 2 python wrap_in_strategy.py --sync_mode=hybrid --sync_group_size=1 --epochs 3
"""
import argparse
import json

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args, _ = parser.parse_known_args()  # tfsyncmodes' own flags are left to make_strategy

import tfsyncmodes
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.keras.compat import keras

strategy = tfsyncmodes.make_strategy()
in_scope = None
with strategy.scope():
    in_scope = tfsyncmodes.wrap(keras.optimizers.SGD(0.1))
    try:
        tfsyncmodes.wrap(keras.optimizers.SGD(0.1), "sync")
        contradiction = None
    except ConfigError as error:
        contradiction = str(error)
outside = strategy.wrap(keras.optimizers.SGD(0.1))  # the strategy's own wrap needs no scope
try:  # outside every scope the knobs are resolved now: hybrid then lacks the strategy's groups
    tfsyncmodes.wrap(keras.optimizers.SGD(0.1))
    unscoped = None
except ConfigError as error:
    unscoped = str(error)
print("RESULT " + json.dumps({
    "rank": strategy.worker_index, "strategy_mode": strategy.mode, "sources": dict(strategy.config.sources),
    "group_size": strategy.config.group_size, "in_scope": in_scope.sync_config.mode,
    "outside": outside.sync_config.mode, "same_config": in_scope.sync_config is strategy.config,
    "contradiction": contradiction, "unscoped": unscoped, "epochs": args.epochs, "class": type(in_scope).__name__}), flush=True)
