"""The flags of ``python -m benchmarks.bench_hybrid`` (see there), in one place for its entry
point, its ranks (:mod:`benchmarks.hybrid_worker`) and its report (:mod:`benchmarks.hybrid_report`);
importing this module defines them."""
from __future__ import annotations

import json

from absl import flags

from benchmarks.benchlib import DOCS

flags.DEFINE_integer("np", 4, "Horovod ranks (groups of 2).")
flags.DEFINE_integer("steps", 120, "Steps of each timed straggler run (c).")
flags.DEFINE_integer("speed_steps", 40, "Steps of each timed speed run (d).")
DEFAULT_CONFIGS = {"defaults": {}, "fixed": {"local_steps": "fixed"},
                   "stale_s400": {"cross_group": "stale", "staleness": 400, "compression": "topk"}}
flags.DEFINE_string("configs", json.dumps(DEFAULT_CONFIGS),
                    "JSON: name -> hybrid knobs over the shipped defaults, for (c) and (d).")
flags.DEFINE_integer("repeats", 3, "(c) and (d): rounds of sync + every configuration, in one job.")
flags.DEFINE_string("accuracy_config", "defaults", "(e): the configuration whose digits accuracy is "
                    "compared with sync's ('' : skip (e)).")
flags.DEFINE_integer("accuracy_epochs", 10, "(e): epochs of scripts/train.py on digits.")
flags.DEFINE_integer("hybrid_steps_factor", 3, "(c): hybrid runs this many times sync's steps.")
flags.DEFINE_integer("batch_size", 64, "Per-rank batch size.")
flags.DEFINE_integer("features", 256, "Input features.")
flags.DEFINE_integer("hidden", 896, "Hidden units (two hidden layers): about 1M parameters.")
flags.DEFINE_float("topk_ratio", 0.01, "Top-K ratio.")
flags.DEFINE_enum("compression", "topk", ["none", "fp16", "topk"], "Cross-group compression whose bytes (a) "
                  "counts; (b) always times Top-K.")
flags.DEFINE_boolean("only_b", False, "Run (a) and (b) only and update (b)'s section of BENCHMARKS.md and its key of "
                     "bench_hybrid.json (skips the straggler runs (c) and (d)).")
flags.DEFINE_integer("b_repeats", 5, "(b): rounds of timings, for the spread.")
flags.DEFINE_string("worker_out", None, "Internal: set when running as a rank of the job.")
flags.DEFINE_string("docs_dir", DOCS, "Where bench_hybrid.json and BENCHMARKS.md go.")
FLAGS = flags.FLAGS
