"""One phase of a launched mode schedule, inside any training script: :class:`PhaseRun`.

A Keras callback that ``strategy.callbacks(model_dir)`` (and ``strategy.fit``) add by
themselves in a process the launcher started for a phase of a ``--sync_mode_schedule`` through
async, so a user's own script runs such a schedule unchanged:

- before training, every process restores the previous phase's checkpoint (the chief alone in
  async, whose variables are on the ps tasks), ``fit`` starts at the phase's first epoch (set
  the way Keras' ``BackupAndRestore`` sets it) and the chief marks the switch in TensorBoard;
- training stops at the phase's last epoch (``model.stop_training``), so ``fit`` is called
  with the run's whole ``epochs`` in every phase, and epochs and the optimizer's step count go
  on across phases;
- after training the chief writes the next checkpoint and appends the phase's epochs, each
  with its mode, to the run's History (``history.json`` in the phase directory).

The phase's own backup and checkpoints go to ``phase_dir`` (``<model_dir>/phase-<i>-<mode>``);
the run keeps one TensorBoard log (``<model_dir>/logs``). With ``eval_data=(x, y)`` the
phase also records the model's loss on it at its start and end (the switch's continuity).
"""
from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.keras.compat import LEGACY, keras
from tfsyncmodes.switching.phases import checkpoint, plan

LOG_DIR = "logs"


def launched_index(environ=None) -> Optional[int]:
    """The phase index the launcher gave this process (None outside a launched schedule;
    a malformed one is reported when training starts)."""
    raw = (os.environ if environ is None else environ).get(plan.ENV_PHASE)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return -1


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean sparse softmax cross-entropy of `logits`, in NumPy (float64)."""
    logits = np.asarray(logits, np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return float(np.mean(log_norm - logits[np.arange(len(labels)), labels]))


class PhaseRun(keras.callbacks.Callback):
    """The phase this process runs (see the module docstring)."""

    def __init__(self, strategy, base_dir: Optional[str] = None, eval_data=None):
        super().__init__()
        if LEGACY:
            raise ConfigError("TF_USE_LEGACY_KERAS", "1", "a schedule through async runs under Keras 3 only",
                              "unset TF_USE_LEGACY_KERAS")
        self.strategy = strategy
        self.base_dir = base_dir
        self.eval_data = eval_data
        self.index = launched_index()
        self.context = None
        self.record: Dict[str, object] = {}
        self.run: Dict[str, object] = {}

    @property
    def phase_dir(self) -> Optional[str]:
        """This phase's own directory (its resume backup, checkpoints, saved model)."""
        if not self.base_dir:
            return None
        return os.path.join(self.base_dir, f"phase-{self.index}-{self.strategy.mode}")

    @property
    def end_epoch(self) -> int:
        return self.context.phase.end_epoch

    def on_train_begin(self, logs=None):
        self.context = plan.context(self.strategy.config, self.params["epochs"], self.params["steps"])
        phase = self.context.phase
        self.record = {"phase": self.context.index, "mode": phase.mode,
                       "start_epoch": phase.start_epoch, "end_epoch": phase.end_epoch}
        self._restore()
        self.model._initial_epoch = max(self.model._initial_epoch or 0, phase.start_epoch) or None

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 >= self.end_epoch:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        self._end(self.model.history)

    def _loss(self) -> Optional[float]:
        if self.eval_data is None:
            return None
        x, y = self.eval_data
        return cross_entropy(self.model(x, training=False), y)

    def _restore(self) -> None:
        """Restores the previous phase's state, writes the plan (first phase) or the switch
        marker, and notes the loss the phase starts from."""
        source = self.context.checkpoint_in()
        if source is not None and (self.strategy.is_chief or self.strategy.mode != "async"):
            meta = checkpoint.restore(self.model, source, self.strategy)
            self.record.update(restored_from=os.path.basename(source), restored_step=meta["step"],
                               restored_digest=meta["restored_digest"], written_digest=meta["digest"])
        if not self.strategy.is_chief:
            return
        if self.context.index == 0:
            plan.write_json(os.path.join(self.context.directory, plan.PLAN_FILE), self.context.plan_record())
        loss = self._loss()
        if loss is not None:
            self.record["loss_at_start"] = loss
        if self.base_dir:
            self._mark_switch(os.path.join(self.base_dir, LOG_DIR, "train"))

    def _mark_switch(self, logdir: str) -> None:
        """A text summary naming the phase's mode and a ``phase`` scalar, at the phase's first
        epoch (the step Keras' epoch summaries use)."""
        phase = self.context.phase
        step = phase.start_epoch
        text = (f"phase {phase.index}: {phase.mode} from epoch {phase.start_epoch} "
                f"(step {phase.start_epoch * self.params['steps']}) to epoch {phase.end_epoch}")
        writer = tf.summary.create_file_writer(logdir)
        with writer.as_default():
            tf.summary.text("mode_switch", text, step=step)
            tf.summary.scalar("phase", float(phase.index), step=step)
        writer.flush()
        writer.close()

    def _end(self, history) -> None:
        """After training, on the chief: the next checkpoint and this phase's History."""
        if not self.strategy.is_chief or self.context is None:
            return
        loss = self._loss()
        if loss is not None:
            self.record["loss_at_end"] = loss
        meta = checkpoint.save(self.model, self.context.checkpoint_out(), epoch=self.end_epoch,
                               mode=self.context.phase.mode, phase=self.context.index)
        self.record.update(step=meta["step"], saved_digest=meta["digest"])
        path = os.path.join(self.context.directory, plan.HISTORY_FILE)
        run = plan.read_json(path, {"schedule": self.context.schedule, "epochs": [], "phases": []})
        run["phases"] = [p for p in run["phases"] if p["phase"] != self.context.index] + [self.record]
        done = {e["epoch"] for e in run["epochs"] if e["phase"] != self.context.index}
        for position, epoch in enumerate(history.epoch):
            if epoch in done:
                continue
            entry = {"epoch": int(epoch), "mode": self.context.phase.mode, "phase": self.context.index}
            entry.update({key: float(values[position]) for key, values in history.history.items()
                          if position < len(values)})
            run["epochs"].append(entry)
        run["epochs"].sort(key=lambda e: e["epoch"])
        plan.write_json(path, run)
        self.run = run

    def metrics(self) -> Dict[str, object]:
        """The run so far, for ``--metrics_file``: every epoch once, with its mode."""
        epochs = self.run["epochs"]
        return {"schedule": self.context.schedule, "epochs_run": [e["epoch"] for e in epochs],
                "modes": [e["mode"] for e in epochs],
                "losses": [e["loss"] for e in epochs if "loss" in e],
                "history": epochs, "phases": self.run["phases"]}
