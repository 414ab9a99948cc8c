"""The public switch between modes within a run, and the ``--sync_mode_schedule`` driver.

:class:`ModeSwitch` is a Keras callback whose :meth:`~ModeSwitch.switch_to` switches the
model's wrapped optimizer to another mode of the run at a step boundary (between two train
steps: call it from ``on_train_batch_begin``/``_end`` or ``on_epoch_*``, on every rank at the
same step). It finishes the outgoing exchange and starts the incoming one clean
(:meth:`tfsyncmodes.exchange.switchable.SwitchableExchange.switch`), has Keras trace the train
function again (Keras 3 and tf_keras both call ``model.train_function`` at every step of
``fit``), tells the strategy, logs one line on the chief and writes a TensorBoard marker.
A policy that decides when to switch subclasses it (:class:`ScheduleSwitch` does). With
``compile(steps_per_execution=N)`` a step boundary is an execution boundary: a switch falls on
the first one at or after the step asked for.

Logs: every batch's and epoch's logs get ``mode`` (the mode's number:
:func:`mode_code`, sync 0, hybrid 2), epoch logs (and so History) also
``mode_switches`` (switches in that epoch) and ``switch_seconds`` (what they cost: from each
switch's start, a Horovod restart included, to the end of the first step after it, which traces
the new mode's train function unless this fit() traced it before; the chief logs its own, and
under Horovod History has the ranks' mean, as of every epoch log). ``bytes_sent`` (cross-group
bytes) is 0 in a step of a mode that does not cross groups, and per epoch the mean over the
epoch's hybrid steps (0 in an epoch without any). With a ``log_dir`` the chief writes, at every
switch step, a scalar ``mode`` and a text ``mode_switch`` ("sync -> hybrid at step 30").
"""
from __future__ import annotations

import time
from typing import List, Optional, Tuple

from absl import logging

import tensorflow as tf

from tfsyncmodes import schedule as schedule_lib
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange.switchable import SwitchableExchange
from tfsyncmodes.keras.compat import keras

# The number a mode's steps carry in the logs and TensorBoard (fixed: logs stay comparable).
MODE_CODES = {"sync": 0, "async": 1, "hybrid": 2}


def wait_for_step(logs) -> None:
    """Waits for the step whose batch `logs` these are (reads one of its values)."""
    import numpy as np

    for value in (logs or {}).values():
        np.asarray(value)
        break


def mode_code(mode: str) -> int:
    """The number logs carry for `mode` (sync 0, async 1, hybrid 2)."""
    return MODE_CODES[mode]


class ModeSwitch(keras.callbacks.Callback):
    """Switches the model's optimizer between the run's modes; see the module doc."""

    def __init__(self, strategy=None, log_dir: Optional[str] = None):
        super().__init__()
        self.strategy = strategy
        self.log_dir = log_dir
        self.switches: List[Tuple[int, str, str]] = []  # (step, from, to), this process's record
        self._in_epoch = 0
        self._switch_seconds = 0.0  # this epoch's switches, each to its first step's end
        self._switch_clock: Optional[float] = None  # the switch under way: when it began
        self._restarts_before = 0.0  # the strategy's Horovod restart seconds when it began
        self._writer = None
        self._traces = {}  # (mode, exchange) -> the train function traced for it, this fit()

    def set_model(self, model):
        super().set_model(model)
        self._traces = {}  # Keras calls this at the start of every fit()

    # --- the switch ----------------------------------------------------------------------
    @property
    def exchange(self):
        """The wrapped optimizer's :class:`~tfsyncmodes.exchange.switchable.SwitchableExchange`."""
        exchange = getattr(getattr(self.model, "optimizer", None), "exchange", None)
        if not isinstance(exchange, SwitchableExchange):
            raise ConfigError("ModeSwitch", "model.optimizer",
                              "the model's optimizer was not wrapped by a strategy that switches modes",
                              "make the strategy with --sync_mode_schedule (or a switch policy) and compile "
                              "with strategy.wrap(optimizer)")
        return exchange

    @property
    def mode(self) -> str:
        """The mode the model trains in now."""
        return self.exchange.active

    @property
    def step(self) -> int:
        """The optimizer's step count (the next step's 0-based index)."""
        return int(tf.convert_to_tensor(self.model.optimizer.iterations).numpy())

    def switch_to(self, mode: str, reason: str = "") -> bool:
        """Switches to `mode` before the next step (eager; every rank at the same step).
        Returns False if the model trains in `mode` already. `reason` goes into the log line."""
        exchange = self.exchange
        previous, step = exchange.active, self.step
        self._traces.setdefault(self._trace_key(), self.model.train_function)
        if not exchange.switch(mode):
            self._switch_clock = None
            return False
        self.start_switch_clock()
        self._retrace()
        if self.strategy is not None and hasattr(self.strategy, "mode_switched"):
            self.strategy.mode_switched(mode)
        self.switches.append((step, previous, mode))
        self._in_epoch += 1
        if self._is_chief():
            logging.info("tfsyncmodes: step %d: switched %s -> %s%s", step, previous, mode,
                         f" ({reason})" if reason else "")
            self._mark(step, f"{previous} -> {mode} at step {step}" + (f" ({reason})" if reason else ""))
        return True

    def activate(self, mode: str) -> None:
        """Makes the optimizer train in `mode` as it is, without finishing or resetting
        anything: for the start of training (a resumed run re-enters its phase)."""
        exchange = self.exchange
        if exchange.active != mode:
            self._traces.setdefault(self._trace_key(), self.model.train_function)
            exchange.activate(mode)
            self._retrace()
        if self.strategy is not None and hasattr(self.strategy, "mode_switched"):
            self.strategy.mode_switched(mode)

    def start_switch_clock(self) -> None:
        """Marks a switch's start (a policy that restarts Horovod first calls it before)."""
        if self._switch_clock is None:
            self._switch_clock = time.perf_counter()
            self._restarts_before = getattr(self.strategy, "restart_seconds", 0.0)

    def _switch_done(self, logs) -> None:
        """At the first step's end after a switch: its cost, from its start (see the module doc)."""
        wait_for_step(logs)
        seconds, self._switch_clock = time.perf_counter() - self._switch_clock, None
        self._switch_seconds += seconds
        if self._is_chief():
            restart = getattr(self.strategy, "restart_seconds", 0.0) - self._restarts_before
            logging.info("tfsyncmodes: step %d: the switch to %s took %.2f s to its first step's end%s",
                         self.step, self.mode, seconds,
                         f" (Horovod restarted in {restart:.2f} s)" if restart > 0 else "")

    def _trace_key(self):
        return self.exchange.active, id(self.exchange.exchanges[self.exchange.active])

    def _retrace(self) -> None:
        # Keras 3 and tf_keras both call `model.train_function` at every step: a new trace
        # runs the active exchange. One trace per exchange is kept for the rest of this fit(),
        # so switching back costs no second trace (a trace takes seconds).
        key = self._trace_key()
        function = self._traces.get(key)
        if function is None:
            self.model.make_train_function(force=True)
            self._traces[key] = self.model.train_function
        else:
            self.model.train_function = function

    # --- logs ----------------------------------------------------------------------------
    def _is_chief(self) -> bool:
        if self.strategy is not None:
            return bool(self.strategy.is_chief)
        return True

    def _mark(self, step: int, text: str) -> None:
        if not self.log_dir:
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default(step=step):
            tf.summary.scalar("mode", float(mode_code(self.exchange.active)))
            tf.summary.text("mode_switch", text)
        self._writer.flush()

    def on_train_begin(self, logs=None):
        if self._is_chief() and self.log_dir:
            self._mark(self.step, f"{self.mode} from step {self.step}")

    def on_epoch_begin(self, epoch, logs=None):
        self._in_epoch, self._switch_seconds = 0, 0.0

    def on_train_batch_end(self, batch, logs=None):
        if self._switch_clock is not None:
            self._switch_done(logs)
        if logs is not None:
            exchange = self.exchange
            logs["mode"] = float(mode_code(exchange.active))
            if "bytes_sent" in logs and not exchange.crosses_groups():
                logs["bytes_sent"] = logs["compression_ratio"] = 0.0  # nothing crosses groups now

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            exchange = self.exchange
            logs["mode"] = float(mode_code(exchange.active))
            logs["mode_switches"] = float(self._in_epoch)
            logs["switch_seconds"] = self._switch_seconds
            if any(exchange.crosses_groups(m) for m in exchange.modes):  # History: one entry per epoch
                logs.setdefault("bytes_sent", 0.0)
                logs.setdefault("compression_ratio", 0.0)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class ScheduleSwitch(ModeSwitch):
    """``--sync_mode_schedule``: the phases (:func:`tfsyncmodes.schedule.phases`) over the run's
    ``epochs * steps_per_epoch`` steps; switches at each phase's first step. A resumed run
    re-enters the phase its step count falls in."""

    def __init__(self, schedule: str, strategy=None, log_dir: Optional[str] = None):
        super().__init__(strategy, log_dir)
        self.schedule = schedule
        self.phases: List[schedule_lib.Phase] = []

    def on_train_begin(self, logs=None):
        epochs, steps = (self.params or {}).get("epochs"), (self.params or {}).get("steps")
        if not steps:
            raise ConfigError("mode_schedule", self.schedule, "the run's steps per epoch are unknown",
                              "pass steps_per_epoch to fit")
        self.phases = schedule_lib.phases(self.schedule, int(epochs) * int(steps), int(steps))
        self.activate(schedule_lib.mode_at(self.phases, self.step))
        if self._is_chief():
            logging.info("tfsyncmodes: mode schedule %s: %s", self.schedule, ", ".join(
                f"{p.mode} steps {p.start}-{p.end - 1}" for p in self.phases))
        super().on_train_begin(logs)

    def on_train_batch_begin(self, batch, logs=None):
        mode = schedule_lib.mode_at(self.phases, self.step)
        if mode != self.exchange.active:
            self.switch_to(mode, "mode schedule")
