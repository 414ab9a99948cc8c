"""The shared sync-mode horovodrun jobs of the compression tests: one job per world size runs
every scenario in turn (tests/workers/sync_steps.py --scenarios), once per test session, and
several tests assert on its saved arrays. Each scenario's knobs are code arguments to
make_strategy("sync", ...)."""
import json
import os

import numpy as np
import pytest

from tests.conftest import PYTHON, WORKERS, run_checked
from tfsync_testbed import localrun

# name: knobs (and "steps") of each scenario, by world size. The two-rank job also checks
# strategy.reduce (--reduce).
JOBS = {
    2: {
        "topk": dict(steps=3, compression="topk", topk_ratio=0.25),
        "topk_union": dict(steps=3, compression="topk", topk_ratio=0.25, topk_shared_indices=True),
        "fp16_feedback": dict(steps=3, compression="fp16"),
        "fp16_no_feedback": dict(steps=3, compression="fp16", error_feedback=False),
        "int8": dict(steps=4, compression="int8"),
        "int8_per_tensor": dict(steps=4, compression="int8", compression_per_tensor=True),
        "topk_int8_per_tensor": dict(steps=4, compression="topk_int8", topk_ratio=0.25, compression_per_tensor=True),
        "topk_int2": dict(steps=4, compression="topk_int2", topk_ratio=0.25),
        "dgc": dict(steps=4, compression="topk", topk_ratio=0.1, dgc=True, dgc_momentum=0.9,
                    dgc_clip_norm=0.5, dgc_warmup_steps=2),
        "dgc_unmasked": dict(steps=4, compression="topk", topk_ratio=0.1, dgc=True, dgc_momentum=0.9,
                             dgc_masking=False),
    },
    4: {
        "topk": dict(steps=3, compression="topk", topk_ratio=0.25),
        "fp16": dict(steps=3, compression="fp16"),
        "topk_union": dict(steps=3, compression="topk", topk_ratio=0.25, topk_shared_indices=True),
    },
}
_DONE = {}
# Every test that uses a job carries this mark: under pytest-xdist they run on one worker, which
# runs each job once.
SHARED = pytest.mark.xdist_group("sync-jobs")


def job(num_proc, tmp_path_factory):
    """The directory of the job of `num_proc` ranks, run on first use."""
    if num_proc not in _DONE:
        outdir = tmp_path_factory.mktemp(f"sync_{num_proc}_ranks")
        command = localrun.horovodrun_command(num_proc, [
            PYTHON, os.path.join(WORKERS, "sync_steps.py"), str(outdir),
            f"--scenarios={json.dumps(JOBS[num_proc])}", *(["--reduce"] if num_proc == 2 else [])])
        run_checked(command, timeout=280)
        _DONE[num_proc] = outdir
    return _DONE[num_proc]


def scenario(outdir, name, num_proc):
    """Every rank's saved arrays of scenario `name`, after checking that each rank ran the
    scenario's steps and holds the same bits as rank 0."""
    workers = [np.load(outdir / f"{name}.worker{i}.npz") for i in range(num_proc)]
    steps = JOBS[num_proc][name]["steps"]
    for w in workers:
        assert int(w["iterations"]) == steps
        np.testing.assert_array_equal(w["kernel"], workers[0]["kernel"])  # the same bits everywhere
        np.testing.assert_array_equal(w["bias"], workers[0]["bias"])
    return workers
