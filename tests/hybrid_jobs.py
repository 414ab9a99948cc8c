"""The hybrid scenarios of the Keras 3 horovodrun tests and the job that trains them: one
``horovodrun -np 4`` run of tests/workers/hybrid_steps.py (groups of 2) trains every scenario
of KERAS3_JOB in turn, once per test session on first use, and several tests (test_hybrid.py,
test_hybrid_composed.py) assert on its saved arrays. run_scenarios runs a job of its own."""
import json
import os

import numpy as np
import pytest

from tests.conftest import PYTHON, WORKERS, run_checked
from tfsync_testbed import localrun

SCENARIOS = {
    "plain": {"compression": "none", "staleness": 0, "topk_ratio": 1.0, "cross_group": "stale"},
    "topk": {"compression": "topk", "topk_ratio": 0.25, "staleness": 0, "cross_group": "stale"},
    "stale_fp16": {"compression": "fp16", "staleness": 2, "cross_group": "stale"},
    "periodic_topk": {"compression": "topk", "topk_ratio": 0.25, "period": 2, "cross_group": "periodic",
                      "local_steps": "fixed"},
    # Steps 0, 1 in lockstep, then rounds apply as they come in, at most one step late.
    "warmup_stale_topk": {"compression": "topk", "topk_ratio": 0.25, "staleness": 1, "warmup_steps": 2,
                          "cross_group": "stale"},
    "warmup_periodic_topk": {"compression": "topk", "topk_ratio": 0.25, "period": 3, "warmup_steps": 1,
                             "cross_group": "periodic", "local_steps": "fixed"},
    # DiLoCo's outer step: Nesterov momentum on the pseudo-gradient (lr 0.7, momentum 0.9).
    "periodic_nesterov_topk": {"compression": "topk", "topk_ratio": 0.25, "period": 2, "cross_group": "periodic",
                               "outer_optimizer": "nesterov", "local_steps": "fixed"},
}
# The same as periodic_topk written two other ways: the outer step `average` with outer lr 1.0,
# and EASGD with alpha = 1 / groups (the center becomes the mean, every group lands on it).
AS_PERIODIC = {
    "periodic_average_lr1": dict(SCENARIOS["periodic_topk"], outer_optimizer="average", outer_lr=1.0),
    "elastic_as_periodic": dict({k: v for k, v in SCENARIOS["periodic_topk"].items() if k != "local_steps"},
                                cross_group="elastic", elastic_alpha=0.5),
}
ELASTIC = {  # EASGD: the paper's default alpha (0.9 / 2 groups) dense; alpha 0.3 with Top-K, error
    # feedback and a warm-up round, ending off a round (so the center is not the groups' mean).
    "elastic_none": {"compression": "none", "period": 2, "cross_group": "elastic"},
    "elastic_topk": {"compression": "topk", "topk_ratio": 0.25, "period": 3, "warmup_steps": 1,
                     "cross_group": "elastic", "elastic_alpha": 0.3},
}
QUANTIZED = {  # the quantizing compressions across groups: one scale over the model's vector, and
    # per tensor (--sync_compression_per_tensor: the kernel's and the bias's own scale and selection)
    "periodic_int8": {"compression": "int8", "period": 2, "cross_group": "periodic", "local_steps": "fixed"},
    "stale_topk_int4_per_tensor": {"compression": "topk_int4", "topk_ratio": 0.25, "staleness": 0,
                                   "cross_group": "stale", "compression_per_tensor": True},
}
KERAS3 = {**SCENARIOS, **AS_PERIODIC, **ELASTIC, **QUANTIZED}  # one job runs them all


# --sync_local_steps=auto with rank 1 slowed 4x: its group runs fewer inner steps per round than
# the other (the run records the rounds; the reference replays them).
AUTO_STEPS = {"auto_topk": {"compression": "topk", "topk_ratio": 0.25, "period": 2, "cross_group": "periodic",
                            "local_steps": "auto", "slow_worker": "1:4.0"}}

# --sync_local_steps=auto with groups of comparable speeds (rank 1 sleeps 0.325 s a step, rank 3
# 0.5 s), so that the slower group's share, 4 x ~0.65, is neither 1 nor H = 4 and rounds to 3.
AUTO_PARTIAL = {"auto_partial": {"compression": "none", "period": 4, "cross_group": "periodic",
                                 "local_steps": "auto", "sleep_after_step": {"1": 0.325, "3": 0.5}, "steps": 8}}

# The period as its own knob, 3 inner steps between averages.
FIXED_STEPS = {"periodic_period_3": {"compression": "none", "period": 3, "cross_group": "periodic",
                                     "local_steps": "fixed"}}

# Periodic averaging with Top-K composed by hand (tests/workers/hybrid_steps.py's
# composed_exchange): once with the settings the knobs of periodic_topk give (period 2, ratio
# 0.25), once with its own period 3 and outer Nesterov step, none of which the strategy's knobs
# say (hybrid's defaults). test_hybrid_composed.py compares the first with periodic_topk.
COMPOSED = {
    "composed_periodic_topk": {"composed": {"period": 2, "topk_ratio": 0.25}},
    "composed_period_3_nesterov": {"composed": {"period": 3, "topk_ratio": 0.25, "outer": "nesterov",
                                                "outer_lr": 0.5, "outer_momentum": 0.8}},
}

# Streaming periodic averaging (--sync_fragments): K fragments of the 18 entries on staggered
# schedules over 8 steps, period 4 (fragment p after steps p * 4 / K + 4j); plain averaging,
# DiLoCo's Nesterov outer step per fragment, and Top-K with error feedback after a warm-up round
# of the whole model. fragments=1 is periodic_period_3 unchanged.
STREAMING = {
    "streaming_2_average": {"compression": "none", "period": 4, "fragments": 2, "cross_group": "periodic",
                            "local_steps": "fixed", "steps": 8},
    "streaming_4_nesterov": {"compression": "none", "period": 4, "fragments": 4, "cross_group": "periodic",
                             "outer_optimizer": "nesterov", "outer_lr": 0.5, "outer_momentum": 0.8,
                             "local_steps": "fixed", "steps": 8},
    "streaming_2_topk_nesterov": {"compression": "topk", "topk_ratio": 0.25, "period": 4, "fragments": 2,
                                  "warmup_steps": 1, "cross_group": "periodic", "outer_optimizer": "nesterov",
                                  "local_steps": "fixed", "steps": 8},
    "streaming_1": dict(FIXED_STEPS["periodic_period_3"], fragments=1),
}
STREAMING_JOB = {**STREAMING, **FIXED_STEPS}  # a job of its own (tests/test_hybrid_streaming.py)

KERAS3_STEPS = 4  # of every scenario without its own "steps"
KERAS3_JOB = {**KERAS3, **AUTO_STEPS, **FIXED_STEPS, **AUTO_PARTIAL, **COMPOSED}
_DONE = {}
# Every test that uses keras3_job carries this mark: under pytest-xdist they run on one worker,
# which runs the job once.
KERAS3_SHARED = pytest.mark.xdist_group("hybrid-keras3-job")


def run_scenarios(tmp_path, scenarios, steps, **env):
    command = localrun.horovodrun_command(4, [PYTHON, os.path.join(WORKERS, "hybrid_steps.py"), str(tmp_path),
                                              json.dumps(scenarios), f"--steps={steps}"])
    run_checked(command, timeout=max(200, 100 + 25 * len(scenarios)), **env)  # ~10 s a scenario, 2 busy cores
    return {name: [np.load(tmp_path / f"{name}.rank{r}.npz") for r in range(4)] for name in scenarios}


def keras3_job(tmp_path_factory):
    """Every rank's saved arrays of every scenario of KERAS3_JOB, by name (run on first use)."""
    if "keras3" not in _DONE:
        _DONE["keras3"] = run_scenarios(tmp_path_factory.mktemp("hybrid_keras3"), KERAS3_JOB, KERAS3_STEPS,
                                        TFSYNC_GROUP_SIZE=2)
    return _DONE["keras3"]
