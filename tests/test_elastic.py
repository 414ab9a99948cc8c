"""Elastic sync and hybrid (``--sync_elastic``) under ``horovodrun --min-np/--max-np
--host-discovery-script`` on loopback: a rank that dies mid-epoch, a rank the discovery script
adds (sync and hybrid), and the knob refused outside horovodrun's elastic mode.

The discovery script names this one machine three ways (localhost, 127.0.0.1, its host name),
one slot each: Horovod's driver blacklists the host of a failed rank, and with one name per
rank only the lost rank's name is blacklisted, so the job goes on with the others."""
import json
import os
import re
import socket
import stat
import subprocess
import time

import numpy as np
import pytest

from tests.conftest import PYTHON, REPO, WORKERS, clean_env
from tests.workers.elastic_run import CLASSES, LEARNING_RATE, data
from tfsync_testbed import localrun

pytestmark = pytest.mark.slow
NAMES = ("localhost", "127.0.0.1", socket.gethostname())
EPOCHS, STEPS, COMMIT = 4, 12, 4
# The collective timeout (a lost rank is found by the ranks it was not connected to only then)
# and how long a joining rank sleeps before it starts Horovod: longer than that timeout, so the
# world waits for it at the rendezvous under the join timeout (120 s, the default) instead.
TIMEOUT, SLOW_JOIN = 4, 6


def discovery(tmp_path, names):
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"{name}:1\n" for name in names))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, hosts


def elastic_job(tmp_path, script, np_start, timeout=200, **env):
    out = tmp_path / "out"
    out.mkdir()
    command = list(localrun.loopback_namespace_prefix()) + [
        *localrun.horovodrun(PYTHON), "--gloo", "--network-interface", "lo", "-np", str(np_start),
        "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(script),
        PYTHON, os.path.join(WORKERS, "elastic_run.py")]
    started = time.monotonic()
    try:
        result = localrun.run(command, timeout=timeout, cwd=REPO, env=clean_env(
            TFSYNC_ELASTIC="true", TFSYNC_ELASTIC_COMMIT=COMMIT, TFSYNC_COLLECTIVE_TIMEOUT=TIMEOUT,
            ELASTIC_OUT=out, ELASTIC_EPOCHS=EPOCHS, ELASTIC_STEPS=STEPS, **env))
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the job did not finish within {timeout} s:\n{(expired.output or '')[-12000:]}\n"
                    f"{(expired.stderr or '')[-5000:]}")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    ranks = {path.name: dict(np.load(out / path.name)) for path in sorted(out.iterdir())}
    return ranks, output, time.monotonic() - started


def numpy_accuracy(weights):
    """The accuracy of the final softmax regression on held-out rows, computed in NumPy."""
    x, y = data(rows=2000, seed=7)
    kernel, bias = weights["arr_0"], weights["arr_1"]
    assert kernel.shape == (x.shape[1], CLASSES)
    return float(((x @ kernel + bias).argmax(axis=1) == y).mean())


def check_one_model_all_steps(ranks, size):
    assert len(ranks) == size, sorted(ranks)
    first = next(iter(ranks.values()))
    for name, rank in ranks.items():
        for key in ("arr_0", "arr_1"):
            np.testing.assert_array_equal(rank[key], first[key], err_msg=name)
        assert int(rank["iterations"]) == EPOCHS * STEPS, name
        assert int(rank["size"]) == size
        history = json.loads(str(rank["history"]))
        assert history["epoch"] == list(range(EPOCHS)), history
    assert numpy_accuracy(first) >= 0.9
    return json.loads(str(first["history"]))


def test_a_lost_rank_rolls_back_to_the_last_commit_and_training_goes_on(tmp_path):
    script, _ = discovery(tmp_path, NAMES)
    # With the strategy's callbacks for a model directory: its backup (epoch ends) must not
    # take the survivors back behind the commit when they train on in the new world.
    ranks, output, _ = elastic_job(tmp_path, script, 3, ELASTIC_KILL=f"3:1:{COMMIT + 2}",
                                   ELASTIC_MODEL_DIR=tmp_path / "model")
    assert f"exits at epoch 1 step {COMMIT + 2}" in output
    # Rolled back to the commit at step COMMIT of epoch 1, not to the epoch's start.
    assert f"tfsyncmodes: world 3 -> 2 at epoch 1 step {COMMIT}" in output, output[-4000:]
    history = check_one_model_all_steps(ranks, 2)
    assert history["world_size"] == [3.0, 2.0, 2.0, 2.0]
    # Recovery: from the exit to the first step finished by the two that are left (the survivors'
    # collectives notice the loss within the collective timeout, 4 s here; Gloo at the join
    # timeout, 120 s, would make it over 60 s).
    killed = float(re.search(r"exits at epoch 1 step \d+ at ([\d.]+)", output).group(1))
    resumed = float(re.search(r"first step in a world of 2 at ([\d.]+)", output).group(1))
    print(f"recovery: {resumed - killed:.1f} s")
    assert 0 < resumed - killed < 60


@pytest.mark.timeout(400)
def test_elastic_hybrid_regroups_when_a_rank_is_lost(tmp_path):
    """Hybrid, one group per host (each rank its own host name here): 3 groups, a rank lost
    mid-round, the two left regroup into 2 groups from the commit at the last round boundary.
    The same job checks ``--sync_elastic_lr=scale``: the rate times size / size at start."""
    script, _ = discovery(tmp_path, NAMES)
    ranks, output, seconds = elastic_job(tmp_path, script, 3, timeout=300, ELASTIC_KILL=f"3:1:{COMMIT + 2}",
                                         TFSYNC_MODE="hybrid", TFSYNC_PERIOD=COMMIT, TFSYNC_ELASTIC_LR="scale")
    print(f"elastic hybrid job: {seconds:.1f} s")
    assert f"exits at epoch 1 step {COMMIT + 2}" in output
    assert f"tfsyncmodes: world 3 -> 2 at epoch 1 step {COMMIT} groups [[0],[1]]" in output, output[-4000:]
    history = check_one_model_all_steps(ranks, 2)
    assert history["world_size"] == [3.0, 2.0, 2.0, 2.0]
    assert [int(rank["groups"]) for rank in ranks.values()] == [2, 2]
    for rank in ranks.values():  # linear scaling from a world of 3 to one of 2
        assert float(rank["learning_rate"]) == pytest.approx(LEARNING_RATE * 2 / 3, rel=1e-6)


@pytest.mark.timeout(400)
def test_a_rank_whose_step_never_ends_starts_again_at_its_deadline_and_rejoins(tmp_path):
    """Horovod can leave a rank's collective pending for ever when a peer is lost (its enqueue
    checks for shutdown before it queues, and the shutdown empties the queue in between): the
    hybrid job of CI's one hang. Here rank 1 never finishes step COMMIT + 1 of epoch 1 while
    the last rank is lost before the step after: at its step deadline (30 s) rank 1 starts
    again in place, in the world of 2 the driver makes, and receives the commit. When it left
    instead, the job hung: with one rank left and --min-np 2, the driver started no process."""
    script, _ = discovery(tmp_path, NAMES)
    ranks, output, seconds = elastic_job(tmp_path, script, 3, timeout=300, ELASTIC_KILL=f"3:1:{COMMIT + 2}",
                                         ELASTIC_HANG=f"3:1:{COMMIT + 1}:1", TFSYNC_MODE="hybrid",
                                         TFSYNC_PERIOD=COMMIT)
    print(f"elastic job with a hung rank: {seconds:.1f} s")
    assert "rank 1 hangs in epoch 1 step 5" in output
    assert "a train step has waited over 30 s (a peer lost in a collective that never ends); this rank starts again" \
        in output, output[-4000:]
    assert f"tfsyncmodes: world 3 -> 2 at epoch 1 step {COMMIT} groups [[0],[1]]" in output, output[-4000:]
    history = check_one_model_all_steps(ranks, 2)
    assert history["world_size"] == [3.0, 2.0, 2.0, 2.0]


@pytest.mark.parametrize("legacy", ["0", "1"], ids=["keras3", "tf_keras"])
def test_a_rank_the_discovery_script_adds_joins_with_the_state(tmp_path, legacy):
    """The rank is added after step 9 of epoch 1, when the next commit (every 4 steps) would be
    the epoch's last step, 12: the change lands at the epoch's end instead, and the new world
    starts epoch 2 (resuming "at step 12" of a 12-step epoch hung under Keras 3). The new rank
    starts Horovod SLOW_JOIN s late, after the collective timeout: the join timeout covers it."""
    script, hosts = discovery(tmp_path, NAMES[:2])
    # With the strategy's callbacks for a model directory too: the joining rank must run the
    # survivors' collectives at its fit's start and start from the state, not the backup.
    ranks, output, _ = elastic_job(tmp_path, script, 2, ELASTIC_ADD=f"1:9:{hosts}:{NAMES[2]}:1",
                                   ELASTIC_JOIN_DELAY=f"2:{SLOW_JOIN}", TF_USE_LEGACY_KERAS=legacy,
                                   ELASTIC_TENSORBOARD=tmp_path / "tensorboard", ELASTIC_MODEL_DIR=tmp_path / "model")
    assert "tfsyncmodes: world 2 -> 3 at epoch 2 step 0" in output, output[-4000:]
    # The new rank started from other weights (seeded by rank) and ends with the others'.
    history = check_one_model_all_steps(ranks, 3)
    assert history["world_size"] == [2.0, 2.0, 3.0, 3.0]
    # Rank 0's TensorBoard callback (the user's, before the commit's) saw the world's size too.
    assert tensorboard_scalars(tmp_path / "tensorboard", "epoch_world_size") == [2.0, 2.0, 3.0, 3.0]


def tensorboard_scalars(log_dir, tag):
    """The values of `tag` in the event files under `log_dir`, by step."""
    import tensorflow as tf

    values = {}
    for path in sorted(log_dir.rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == tag:
                    scalar = value.simple_value if value.HasField("simple_value") else tf.make_ndarray(value.tensor)
                    values[event.step] = float(scalar)
    return [values[step] for step in sorted(values)]


def test_a_rank_lost_after_a_join_and_before_the_next_commit_is_a_line_of_the_world_it_left(tmp_path):
    """The added rank joins at epoch 2's start, then (as the last rank of a world of 3) exits
    before step 2, before the next commit: the world goes back to 2 and the line says so, from
    the world of 3 the job was in (the last commit, at epoch 1's end, was in a world of 2)."""
    script, hosts = discovery(tmp_path, NAMES[:2])
    ranks, output, _ = elastic_job(tmp_path, script, 2, ELASTIC_ADD=f"1:9:{hosts}:{NAMES[2]}:1",
                                   ELASTIC_KILL="3:2:2")
    assert "tfsyncmodes: world 2 -> 3 at epoch 2 step 0" in output, output[-4000:]
    assert "exits at epoch 2 step 2" in output
    assert "tfsyncmodes: world 3 -> 2 at epoch 2 step 0" in output, output[-4000:]
    history = check_one_model_all_steps(ranks, 2)
    assert history["world_size"] == [2.0, 2.0, 2.0, 2.0]


@pytest.mark.timeout(400)
def test_a_rank_the_discovery_script_adds_joins_a_hybrid_job_as_its_own_group(tmp_path):
    """Hybrid, one group per host: the rank on the added host name becomes a third group at the
    epoch's end; every rank ends with one model, every step, and the exchange links 3 groups."""
    script, hosts = discovery(tmp_path, NAMES[:2])
    ranks, output, _ = elastic_job(tmp_path, script, 2, timeout=300, ELASTIC_ADD=f"1:9:{hosts}:{NAMES[2]}:1",
                                   ELASTIC_JOIN_DELAY=f"2:{SLOW_JOIN}", TFSYNC_MODE="hybrid", TFSYNC_PERIOD=COMMIT)
    assert "tfsyncmodes: world 2 -> 3 at epoch 2 step 0 groups [[0],[1],[2]]" in output, output[-4000:]
    history = check_one_model_all_steps(ranks, 3)
    assert history["world_size"] == [2.0, 2.0, 3.0, 3.0]
    assert [int(rank["groups"]) for rank in ranks.values()] == [3, 3, 3]


def test_elastic_outside_horovodrun_elastic_mode_is_one_line_and_exit_2():
    command = [PYTHON, os.path.join(REPO, "scripts", "train.py"), "--sync_elastic", "--epochs", "1"]
    result = subprocess.run(command, env=clean_env(), cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("tfsyncmodes: error")]
    assert lines == ["tfsyncmodes: error: flag: --sync_elastic: needs the horovod backend, not "
                     "mirrored; launch with: horovodrun -np N --min-np N --max-np M --host-discovery-script "
                     "SCRIPT python ..., or turn elastic off"], result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def test_a_collective_failed_with_a_peer_in_the_state_sync_is_a_lost_rank_to_horovods_loop():
    """Horovod's elastic loop syncs the state inside its retry and answers only its own
    HorovodInternalError with a rollback: a broadcast that failed because a peer was lost (the
    message Horovod's op gives) becomes one; an error of another kind stays as it is."""
    import tensorflow as tf
    from horovod.common.exceptions import HorovodInternalError

    from tfsyncmodes.strategies.elastic import lost_peers_as_internal_errors

    shut = "Horovod has been shut down. This was caused by an exception on one of the ranks [Op:HorovodBroadcast]"
    with pytest.raises(HorovodInternalError):
        with lost_peers_as_internal_errors():
            raise tf.errors.UnknownError(None, None, shut)
    with pytest.raises(tf.errors.InvalidArgumentError):
        with lost_peers_as_internal_errors():
            raise tf.errors.InvalidArgumentError(None, None, "shapes differ")


RESUME_PROGRAM = r"""
import json
import sys
import numpy as np
import tensorflow as tf
from tfsyncmodes.keras.compat import keras
from tfsyncmodes.strategies.elastic import ElasticCommit, EndPartEpoch

class State:  # the fields of the elastic state the commit callback reads and writes
    epoch, batch, logs = 1, 6, []
    def commit(self):
        commits.append((self.epoch, self.batch))

class StopAt(keras.callbacks.Callback):  # a user's callback that stops the training at an epoch's end
    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = self.model.stop_training or epoch == int(sys.argv[1])

commits, epochs_seen, fits = [], [], []
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 3)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
initial = [np.asarray(w).tolist() for w in model.layers[0].get_weights()]
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat(), epochs=4, initial_epoch=1,
          steps_per_epoch=10, verbose=0,
          callbacks=[EndPartEpoch(6, 10), StopAt(),
                     keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: epochs_seen.append(e)),
                     ElasticCommit(State(), "epoch", 6, 10, part_epoch=lambda s, d: fits.append((s, d)))])
print(json.dumps({"iterations": int(np.asarray(model.optimizer.iterations)), "commits": commits,
                  "epochs": epochs_seen, "part_epoch": fits, "initial": initial, "kernel": np.asarray(model.layers[0].kernel).tolist(),
                  "bias": np.asarray(model.layers[0].bias).tolist()}))
"""


@pytest.mark.parametrize("legacy", ["0", "1"], ids=["keras3", "tf_keras"])
def test_a_part_done_epoch_and_the_epochs_after_it_run_in_one_fit(legacy):
    """A world resumed at step 6 of epoch 1 (of 10 steps) finishes that epoch after its 4 steps
    left and runs epochs 2 and 3 in the same fit (a second fit costs a start and, in hybrid, a
    drain of the exchange): 24 steps, a commit at each epoch's end, the mode told the steps done,
    and the weights of 24 steps of plain SGD (NumPy). A user's callback that stops the training at
    the part-done epoch's end still stops it."""
    def run(stop_at):
        result = subprocess.run([PYTHON, "-c", RESUME_PROGRAM, str(stop_at)], capture_output=True, text=True,
                                timeout=120, env=clean_env(TF_USE_LEGACY_KERAS=legacy), cwd=REPO)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    out = run(stop_at=-1)
    assert out["iterations"] == 24 and out["epochs"] == [1, 2, 3]
    assert out["commits"] == [[2, 0], [3, 0], [4, 0]] and out["part_epoch"] == [[10, 6]]
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 3)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    w, b = (np.asarray(v, np.float64) for v in out["initial"])
    for step in range(24):  # batches of 4 in order, the data repeated
        xb, yb = x[4 * (step % 16):4 * (step % 16) + 4], y[4 * (step % 16):4 * (step % 16) + 4]
        error = xb @ w + b - yb
        w, b = w - 0.1 * 2 * xb.T @ error / len(xb), b - 0.1 * 2 * error.mean(axis=0)
    np.testing.assert_allclose(out["kernel"], w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["bias"], b, rtol=1e-4, atol=1e-5)
    stopped = run(stop_at=1)
    assert stopped["iterations"] == 4 and stopped["epochs"] == [1] and stopped["commits"] == [[2, 0]]
