"""Resume, value for value (Keras 3, horovodrun -np 2): the values a resumed run starts from
are the backup's, read here with h5py (not through the package's or Keras' restore path), for
the model's weights and every optimizer variable (the inner optimizer's slots and step count,
the exchange's anchors and counters); and a run stopped after 2 of 4 epochs and rerun with the
same model directory ends bit for bit where the same run left uninterrupted ends, which
NumPy's reference reaches too.

Sync with Adam (its moments and step count carry the resume). Hybrid with one rank per group,
SGD and ``--sync_period=3``: every epoch (3 steps) ends on a cross-group round, so the chief's
model and anchor are every group's and the backup (which the chief writes and every rank
restores) holds the whole state; a resume inside a round restarts every group from the chief's.
The killed-process resumes are ``tests/test_resume.py``'s.
"""
import json
import os

import h5py
import numpy as np
import pytest

from tests import reference
from tests.conftest import PYTHON, WORKERS, run_checked
from tfsync_testbed import localrun

EPOCHS, FIRST, STEPS = 4, 2, 3  # STEPS: tests/workers/resume_values.py's steps per epoch
CASES = {"sync_adam": ("adam", {"TFSYNC_MODE": "sync"}),
         "hybrid_sgd": ("sgd", {"TFSYNC_MODE": "hybrid", "TFSYNC_GROUP_SIZE": "1", "TFSYNC_PERIOD": "3",
                                 "TFSYNC_LOCAL_STEPS": "fixed"})}


def train(out, model_dir, epochs, case):
    optimizer, knobs = CASES[case]
    out.mkdir()
    command = [PYTHON, os.path.join(WORKERS, "resume_values.py"), str(out), str(model_dir), str(epochs), optimizer]
    # One thread per op: every sum is taken in one order, so two runs can agree bit for bit.
    run_checked(localrun.horovodrun_command(2, command), timeout=240, TF_NUM_INTRAOP_THREADS=1,
                TF_NUM_INTEROP_THREADS=1, **knobs)
    return [dict(np.load(out / f"rank{rank}.npz")) for rank in (0, 1)]


def values(run, when):
    return [run[f"{when}.{i}"] for i in range(len(run["names"]))]


def read_backup(path, names):
    """The Keras 3 weights file, read with h5py: the layer's variables, then the optimizer's
    (``optimizer/vars/<i>``, in ``optimizer.variables`` order, its inner optimizer's included),
    and separately the inner optimizer's own copy (``optimizer/inner_optimizer/vars/<i>``)."""
    with h5py.File(path, "r") as handle:
        layer = handle["layers/dense/vars"]
        optimizer = handle["optimizer/vars"]
        inner = handle["optimizer/inner_optimizer/vars"]
        assert len(layer) + len(optimizer) == len(names), (list(layer), list(optimizer), names)
        backup = [np.array(layer[str(i)]) for i in range(len(layer))]
        backup += [np.array(optimizer[str(i)]) for i in range(len(optimizer))]
        return backup, [np.array(inner[str(i)]) for i in range(len(inner))]


def assert_same(actual, expected, names, what):
    for name, a, e in zip(names, actual, expected):
        assert a.shape == e.shape and np.array_equal(a, e), f"{what}: {name}: {a} != {e}"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_resumed_run_restores_every_value_and_ends_as_the_uninterrupted_run(tmp_path, case):
    whole = train(tmp_path / "whole", tmp_path / "whole_dir", EPOCHS, case)
    first = train(tmp_path / "first", tmp_path / "dir", FIRST, case)
    names = [str(n) for n in first[0]["names"]]
    backup_dir = tmp_path / "dir" / "backup"
    record = json.loads((backup_dir / "training_metadata.json").read_text())
    assert record["epoch"] == FIRST  # epochs completed
    backup, inner = read_backup(backup_dir / record["weights"], names)  # the weights the record names
    inner_names = [n for n in names if n.startswith(("adam/", "sgd/"))]
    assert len(inner) == len(inner_names) > 0, (inner_names, len(inner))
    # The backup is what the chief held after epoch FIRST: FIRST * STEPS steps of the inner
    # optimizer (the step count the wrapper reports as its ``iterations``).
    iterations = [b for n, b in zip(names, backup) if n in inner_names and n.endswith("/iteration")]
    assert [int(i) for i in iterations] == [FIRST * STEPS], (names, iterations)
    # The weights and the inner optimizer's state the chief ended with (the exchange's own may be
    # finished at the end of training: hybrid's final average).
    kept = [i for i, n in enumerate(names) if n.startswith("sequential") or n in inner_names]
    assert_same([backup[i] for i in kept], [values(first[0], "end")[i] for i in kept], [names[i] for i in kept],
                "backup vs the chief's end")

    resumed = train(tmp_path / "resumed", tmp_path / "dir", EPOCHS, case)
    for rank in (0, 1):
        begin = values(resumed[rank], "begin")
        assert_same(begin, backup, names, f"rank {rank} restored vs backup")
        assert_same([b for n, b in zip(names, begin) if n in inner_names], inner, inner_names,
                    f"rank {rank} restored vs the inner optimizer's backup")
        assert_same(values(resumed[rank], "end"), values(whole[rank], "end"), names,
                    f"rank {rank} resumed vs uninterrupted")

    # NumPy from rank 0's initial weights (broadcast to every rank): 4 epochs of the same batches.
    x, y = reference.linear_data(STEPS, 2)
    x, y = np.concatenate([x] * EPOCHS), np.concatenate([y] * EPOCHS)
    kernel, bias = whole[0]["begin.0"], whole[0]["begin.1"]
    if case == "sync_adam":
        expected = reference.mean_gradient_training(kernel, bias, x, y, optimizer="adam")
    else:
        expected = reference.hybrid_training(kernel, bias, x, y, groups=[[0], [1]], cross_group="periodic",
                                             period=3)[0]
    for rank in (0, 1):
        for got, want in zip(values(resumed[rank], "end")[:2], expected):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
