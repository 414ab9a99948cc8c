"""tfsyncmodes.strategies.step_deadline: an elastic rank whose train step outlives the deadline
leaves the job (one line, status 1); the first steps of a fit (tracing) and steps within the
deadline do not. The step waits in TensorFlow's runtime (a tf.data sleep inside the step), as a
collective that never ends does."""
import subprocess
import time

import pytest

from tests.conftest import PYTHON, REPO, clean_env

PROGRAM = r"""
import sys
import numpy as np
import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing
from tfsyncmodes.keras.compat import keras
from tfsyncmodes.strategies.step_deadline import StepDeadline

waits = [float(w) for w in sys.argv[1].split(",")]  # seconds the step i waits, in the step
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


def run(waits, seconds, timeout=120):
    started = time.monotonic()
    result = subprocess.run([PYTHON, "-c", PROGRAM, ",".join(map(str, waits)), str(seconds)], capture_output=True,
                            text=True, timeout=timeout, env=clean_env(), cwd=REPO)
    return result, time.monotonic() - started


def test_a_step_over_the_deadline_ends_the_rank_with_one_line_and_status_1():
    result, took = run([0, 0, 0, 0, 60, 0], 2)  # the fifth step waits 60 s
    assert result.returncode == 1, result.stderr[-2000:]
    assert "fit ended" not in result.stdout
    lines = [l for l in result.stderr.splitlines() if "tfsyncmodes: elastic:" in l]
    assert lines == ["tfsyncmodes: elastic: a train step has waited over 2 s (a peer lost in a collective that "
                     "never ends); this rank leaves the job and the others go on without it"], result.stderr[-2000:]
    assert took < 50, took  # ended at the deadline, not after the step's 60 s


@pytest.mark.parametrize("waits", [[4, 4, 0, 0, 0], [0, 0, 1, 1, 1]], ids=["tracing-steps", "within"])
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
    result = subprocess.run([PYTHON, "-c", IDLE, "idle" if call_idle else "no"], capture_output=True, text=True,
                            timeout=120, env=clean_env(), cwd=REPO)
    if call_idle:
        assert result.returncode == 0 and "waited" in result.stdout, result.stderr[-2000:]
    else:  # what the elastic loop's idle() is there for: the deadline would end a rank that waits
        assert result.returncode == 1 and "waited" not in result.stdout, result.stderr[-2000:]
        assert "tfsyncmodes: elastic: a train step has waited over 2 s" in result.stderr
