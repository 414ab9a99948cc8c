"""Fault injection: ``--sync_slow_worker=INDEX:FACTOR[@START%-END%]``, a straggler to rehearse with.

A feature for users who want to see how a mode behaves when one worker is slower than the
others, without a slow machine: the knob ``slow_worker`` (flag ``--sync_slow_worker``, env
``TFSYNC_SLOW_WORKER``, YAML ``slow_worker``) names the worker and how many times slower it runs.

- Horovod ranks and tf.distribute workers (sync, hybrid, switching): a Keras callback,
  :class:`SlowWorker`, sleeps after each step so that the step takes `FACTOR` times as long.
  With a window (``1:4.0@30%-60%``) it sleeps only while the run's step is inside that part of
  the run's steps (``epochs * steps`` as Keras passes them to callbacks): a transient straggler.
  :func:`callbacks_for` gives the callbacks for one worker; ``strategy.callbacks()`` and
  ``strategy.fit()`` add them explicitly after the mode's required callbacks (a custom loop
  that builds its own callback list adds ``callbacks_for(strategy.config,
  strategy.worker_index)`` itself).
- Async workers: a step runs inside the worker's TensorFlow server, where no callback runs
  and the step count is unknown, so the parameter-server strategy slows the whole worker
  process instead (:func:`throttle_self` with :func:`slow_worker_factor`: SIGSTOP/SIGCONT
  for ``1 - 1/FACTOR`` of every 50 ms), and refuses a window (:func:`refuse_window`).
- ``--sync_mode=auto`` sees the slowdown as it sees any straggler: in the steps it profiles.

Nothing here runs unless ``slow_worker`` is set; it is not needed to train.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from typing import Any, List, Optional, Tuple

import numpy as np

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.keras.compat import keras

ONE_OFF = 3.0  # a step over this many times the recent median is a one-off (a trace)
THROTTLE_PERIOD_SECONDS = 0.05  # an async worker runs 1/FACTOR of every period


@dataclasses.dataclass(frozen=True)
class SlowSpec:
    """Worker `index` runs `factor` times slower while the step is in [start, end) of the run
    (fractions of its steps; 0 and 1 when the whole run)."""

    index: int
    factor: float
    start: float = 0.0
    end: float = 1.0

    @property
    def transient(self) -> bool:
        return (self.start, self.end) != (0.0, 1.0)

    def window_steps(self, total_steps: int) -> Tuple[int, int]:
        """The steps [first, stop) of a run of `total_steps` that run slow."""
        return int(round(self.start * total_steps)), int(round(self.end * total_steps))


def parse_spec(text: str) -> Optional[SlowSpec]:
    """The canonical knob text (``knobs._slow_worker``) as a SlowSpec; None when off."""
    if not text:
        return None
    head, _, window = text.partition("@")
    index, factor = head.split(":")
    if not window:
        return SlowSpec(int(index), float(factor))
    start, end = (float(part.rstrip("%")) / 100.0 for part in window.split("-"))
    return SlowSpec(int(index), float(factor), start, end)


def slow_spec(config: Any, worker_index: int) -> Optional[SlowSpec]:
    """The straggler spec when `config.slow_worker` names `worker_index` (None: not slowed)."""
    spec = parse_spec(config.slow_worker)
    return spec if spec is not None and spec.index == worker_index and spec.factor > 1.0 else None


def slow_worker_factor(config: Any, worker_index: int) -> float:
    """How many times slower `worker_index` must run under `config.slow_worker` (1.0: not)."""
    spec = slow_spec(config, worker_index)
    return spec.factor if spec is not None else 1.0


def refuse_window(config: Any, where: str) -> None:
    """ConfigError when `config.slow_worker` has a window in a mode that cannot honour it."""
    spec = parse_spec(config.slow_worker)
    if spec is not None and spec.transient:
        raise ConfigError(config.sources.get("slow_worker", "default"), "slow_worker",
                          f"{config.slow_worker!r} has a window, which {where} cannot follow",
                          f"use {spec.index}:{spec.factor} (slow throughout) in this mode")


class SlowWorker(keras.callbacks.Callback):
    """Fault injection: after each step, sleeps so that the step took `factor` times as long;
    with `window` (fractions of the run's steps, as in :class:`SlowSpec`) only inside it.

    What ``--sync_slow_worker=INDEX:FACTOR[@START%-END%]`` adds on worker INDEX (see
    :func:`callbacks_for`); the benchmarks use it to model a straggler.
    """

    def __init__(self, factor: float, window: Tuple[float, float] = (0.0, 1.0)):
        super().__init__()
        self.factor = factor
        self.window = window
        self._started = 0.0
        self._epoch = 0
        self._steps = (0, 1 << 62)  # [first, stop) in steps; set at train begin
        self._recent = collections.deque(maxlen=20)  # the last steps' own times

    def on_train_begin(self, logs=None):
        steps = (self.params or {}).get("steps") or 0
        epochs = (self.params or {}).get("epochs") or 1
        if self.window != (0.0, 1.0):
            if not steps:
                            raise ConfigError("fit", "steps_per_epoch", "--sync_slow_worker with a window needs the "
                                  "run's length", "pass steps_per_epoch to fit")
            spec = SlowSpec(0, self.factor, *self.window)
            self._steps = spec.window_steps(int(steps) * int(epochs))
        self._per_epoch = int(steps)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def slow_at(self, step: int) -> bool:
        """Whether the run's step `step` (0-based) runs slow."""
        return self._steps[0] <= step < self._steps[1]

    def on_train_batch_begin(self, batch, logs=None):
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if not self.slow_at(self._epoch * self._per_epoch + batch):
            return
        for value in (logs or {}).values():
            np.asarray(value)  # waits for the step's result: time the step, not its dispatch
            break
        elapsed = time.perf_counter() - self._started
        # A one-off step (a trace, a mode switch retracing) counts as a typical one: a slow
        # machine runs its steps `factor` times slower, not its tracing. The run's first step,
        # with nothing typical to go by yet, is its trace: not slowed.
        typical = statistics.median(self._recent) if self._recent else None
        self._recent.append(elapsed)
        if typical is not None:
            time.sleep((self.factor - 1.0) * min(elapsed, ONE_OFF * typical))


def callbacks_for(config: Any, worker_index: int) -> List:
    """The fault-injection callbacks worker `worker_index` runs under `config`: a
    :class:`SlowWorker` when ``slow_worker`` names it, else none. None in async mode, whose
    workers are throttled as whole processes (:func:`throttle_self`) and whose chief computes
    no steps."""
    spec = slow_spec(config, worker_index)
    if spec is None or config.mode == "async":
        return []
    return [SlowWorker(spec.factor, (spec.start, spec.end))]


_WATCHER = r"""
import os, signal, sys, time
target, run_fraction, period = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
while True:
    try:
        time.sleep(period * run_fraction)
        os.kill(target, signal.SIGSTOP)
        time.sleep(period * (1.0 - run_fraction))
        os.kill(target, signal.SIGCONT)
    except ProcessLookupError:
        break
"""


def throttle_self(factor: float) -> subprocess.Popen:
    """Slows this process down `factor` times, as a slower machine would: a small watcher
    process pauses it (SIGSTOP) for ``1 - 1/factor`` of every :data:`THROTTLE_PERIOD_SECONDS`
    and resumes it (SIGCONT) for the rest; the watcher ends as soon as this process is gone."""
    return subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid()), str(1.0 / factor),
                             str(THROTTLE_PERIOD_SECONDS)], stdin=subprocess.DEVNULL)
