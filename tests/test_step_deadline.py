"""tfsyncmodes.strategies.step_deadline: an elastic rank whose train step outlives the deadline
starts again in place (one line, the same command in the same process), and after its last
restart leaves the job (one line, status 1); the first steps of a fit (tracing) and steps within
the deadline do not. The step waits in TensorFlow's runtime (a tf.data sleep inside the step),
as a collective that never ends does."""
import subprocess
import time

import pytest

from tests.conftest import PYTHON, REPO, clean_env

PROGRAM = r"""
import os
import sys
import numpy as np
import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing
from tfsyncmodes.keras.compat import keras
from tfsyncmodes.strategies.step_deadline import StepDeadline

run = int(os.environ.get("TFSYNC_STEP_DEADLINE_RESTARTS", "0"))
print(f"run {run} in process {os.getpid()}", flush=True)
# Seconds the step i waits, in the step: one list per run, ";" between runs (the last list again).
runs = sys.argv[1].split(";")
waits = [float(w) for w in runs[min(run, len(runs) - 1)].split(",")]
data = tf.data.Dataset.from_tensor_slices((np.ones((len(waits), 2), np.float32), np.ones((len(waits), 1), np.float32)))
data = data.batch(1)
sleeps = tf.data.Dataset.from_tensor_slices(tf.constant([int(w * 1e6) for w in waits], tf.int64)).flat_map(
    lambda us: tf.data.Dataset.from_tensors(us).apply(testing.sleep(us)).take(1))
options = tf.data.Options()
options.experimental_optimization.inject_prefetch = False
data = tf.data.Dataset.zip((data, sleeps)).map(lambda element, _: element).with_options(options)
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(data, epochs=1, verbose=0, callbacks=[StepDeadline(float(sys.argv[2]))])
print("fit ended", flush=True)
"""


def run(waits, seconds, timeout=120, **env):
    """`waits`: one list of per-step waits, or a list of them (one per run of the program)."""
    runs = waits if isinstance(waits[0], list) else [waits]
    started = time.monotonic()
    result = subprocess.run([PYTHON, "-c", PROGRAM, ";".join(",".join(map(str, w)) for w in runs), str(seconds)],
                            capture_output=True, text=True, timeout=timeout, env=clean_env(**env), cwd=REPO)
    return result, time.monotonic() - started


def deadline_lines(result):
    return [line for line in result.stderr.splitlines() if "tfsyncmodes: elastic:" in line]


def test_a_step_over_the_deadline_starts_the_rank_again_in_its_own_process():
    # The first run's fifth step waits 600 s; the second run's steps do not wait.
    result, took = run([[0, 0, 0, 0, 600, 0], [0, 0, 0]], 2)
    assert result.returncode == 0, result.stderr[-2000:]
    assert deadline_lines(result) == [
        "tfsyncmodes: elastic: a train step has waited over 2 s (a peer lost in a collective that never "
        "ends); this rank starts again and rejoins (restart 1 of 3)"], result.stderr[-2000:]
    starts = [line.split() for line in result.stdout.splitlines() if line.startswith("run ")]
    assert [words[1] for words in starts] == ["0", "1"], result.stdout
    assert starts[0][-1] == starts[1][-1], starts  # the same process: its launcher sees no exit
    assert result.stdout.count("fit ended") == 1
    # Restarted at the deadline, not after the step's 600 s (two cold starts on a loaded machine
    # fit well inside the bound).
    assert took < 110, took


def test_after_its_last_restart_a_rank_over_the_deadline_leaves_with_one_line_and_status_1():
    result, took = run([0, 0, 0, 0, 600, 0], 2, TFSYNC_STEP_DEADLINE_RESTARTS=3)  # 3 restarts done
    assert result.returncode == 1, result.stderr[-2000:]
    assert "fit ended" not in result.stdout
    assert deadline_lines(result) == [
        "tfsyncmodes: elastic: a train step has waited over 2 s (a peer lost in a collective that never "
        "ends); this rank leaves the job and the others go on without it"], result.stderr[-2000:]
    assert took < 110, took  # left at the deadline, not after the step's 600 s


@pytest.mark.parametrize("waits", [[4, 4, 0, 0, 0], [0, 0, 0.5, 0.5, 0.5]], ids=["tracing-steps", "within"])
def test_the_first_steps_of_a_fit_and_steps_within_the_deadline_go_on(waits):
    result, _ = run(waits, 2)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "fit ended" in result.stdout and "tfsyncmodes: elastic:" not in result.stderr


IDLE = r"""
import sys, time
import numpy as np
import tensorflow as tf
from tfsyncmodes.keras.compat import keras
from tfsyncmodes.strategies.step_deadline import StepDeadline


class Fails(keras.callbacks.Callback):  # the third step's end raises, as a lost peer's collective does
    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            raise RuntimeError("a collective failed")


model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
deadline = StepDeadline(2.0)
try:  # Fails ends the fit before the deadline's own batch end: the step stays "under way"
    model.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=1, epochs=1, verbose=0, callbacks=[Fails(), deadline])
except RuntimeError:
    if sys.argv[1] == "idle":
        deadline.idle()
time.sleep(4)  # the rank waits at the rendezvous, longer than the deadline
print("waited", flush=True)
"""


@pytest.mark.parametrize("call_idle", [True, False], ids=["idle", "not-idle"])
def test_a_fit_ended_by_an_exception_is_no_step_once_idle_is_called(call_idle):
    # Restarts used up: a deadline that fires ends the rank at once.
    result = subprocess.run([PYTHON, "-c", IDLE, "idle" if call_idle else "no"], capture_output=True, text=True,
                            timeout=120, env=clean_env(TFSYNC_STEP_DEADLINE_RESTARTS=3), cwd=REPO)
    if call_idle:
        assert result.returncode == 0 and "waited" in result.stdout, result.stderr[-2000:]
    else:  # what the elastic loop's idle() is there for: the deadline would end a rank that waits
        assert result.returncode == 1 and "waited" not in result.stdout, result.stderr[-2000:]
        assert "tfsyncmodes: elastic: a train step has waited over 2 s" in result.stderr
