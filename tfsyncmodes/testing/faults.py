"""``--slow_worker=INDEX:FACTOR``: a straggler to rehearse with.

Under Horovod a rank is slowed by a Keras callback (:class:`SlowWorker`) that sleeps after each
step; an async worker's steps run inside its TensorFlow server, where no callback runs, so the
whole process is throttled (:func:`tfsyncmodes.testing.throttle.throttle_self`).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from tfsyncmodes.keras.compat import keras


def slow_worker_factor(config: Any, worker_index: int) -> float:
    """How many times slower `worker_index` must run under `config.slow_worker` (1.0: not)."""
    if not config.slow_worker:
        return 1.0
    index, factor = config.slow_worker.split(":")
    return float(factor) if int(index) == worker_index else 1.0


class SlowWorker(keras.callbacks.Callback):
    """Fault injection: after each step, sleeps so that the step took `factor` times as long.

    Used by the benchmarks (``--slow_worker=INDEX:FACTOR``) to model a straggler.
    """

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor
        self._started = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        for value in (logs or {}).values():
            np.asarray(value)  # waits for the step's result: time the step, not its dispatch
            break
        elapsed = time.perf_counter() - self._started
        time.sleep((self.factor - 1.0) * elapsed)
