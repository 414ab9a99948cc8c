"""One phase of a launched mode schedule, inside the training script.

Before training: every process restores the previous phase's checkpoint (the chief alone in
async, whose variables are on the ps tasks) and the chief marks the switch in TensorBoard.
Training: ``fit`` starts at the phase's first epoch (``initial_epoch``, set the way Keras'
``BackupAndRestore`` sets it) and ends at its last, so epochs and the optimizer's step count
go on across phases. After training: the chief writes the next checkpoint and appends the
phase's epochs, each with its mode, to the run's History (``history.json`` in the phase
directory, and in ``--metrics_file``).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np

from tfsyncmodes.keras.compat import LEGACY, keras
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.switching.phases import checkpoint, plan
from tfsyncmodes.switching.phases.plan import PhaseContext

LOG_DIR = "logs"


def current(strategy, epochs: int, steps_per_epoch: int) -> Optional["Phase"]:
    """This process's phase (None outside a launched schedule)."""
    found = plan.context(strategy.config, epochs, steps_per_epoch)
    if found is None:
        return None
    if LEGACY:
        raise ConfigError("TF_USE_LEGACY_KERAS", "1", "a schedule through async runs under Keras 3 only",
                          "unset TF_USE_LEGACY_KERAS")
    return Phase(found, strategy, steps_per_epoch)


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean sparse softmax cross-entropy of `logits`, in NumPy (float64)."""
    logits = np.asarray(logits, np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return float(np.mean(log_norm - logits[np.arange(len(labels)), labels]))


class StartAtPhase(keras.callbacks.Callback):
    """Starts ``fit`` at the phase's first epoch (a resumed phase's backup may start later)."""

    def __init__(self, start_epoch: int):
        super().__init__()
        self.start_epoch = start_epoch

    def on_train_begin(self, logs=None):
        self.model._initial_epoch = max(self.model._initial_epoch or 0, self.start_epoch) or None


class Phase:
    """The phase this process runs (see the module docstring)."""

    def __init__(self, context: PhaseContext, strategy, steps_per_epoch: int):
        self.context = context
        self.strategy = strategy
        self.steps_per_epoch = steps_per_epoch
        self.record: Dict[str, object] = {"phase": context.index, "mode": context.phase.mode,
                                          "start_epoch": context.phase.start_epoch,
                                          "end_epoch": context.phase.end_epoch}

    @property
    def end_epoch(self) -> int:
        return self.context.phase.end_epoch

    def model_dir(self, base: str) -> str:
        """This phase's own directory (its resume backup, checkpoints, saved model)."""
        return os.path.join(base, f"phase-{self.context.index}-{self.context.phase.mode}")

    def callbacks(self, base: str) -> List:
        """Start at the phase's epoch; on the chief, the run's one TensorBoard log."""
        out = [StartAtPhase(self.context.phase.start_epoch)]
        if self.strategy.is_chief:
            out.append(keras.callbacks.TensorBoard(os.path.join(base, LOG_DIR)))
        return out

    def begin(self, model, base: str, x_eval, y_eval) -> None:
        """Before training: restore the previous phase's state, write the plan (first phase)
        or the switch marker, and note the loss the phase starts from."""
        source = self.context.checkpoint_in()
        if source is not None and (self.strategy.is_chief or self.strategy.mode != "async"):
            meta = checkpoint.restore(model, source, self.strategy)
            self.record.update(restored_from=os.path.basename(source), restored_step=meta["step"],
                               restored_digest=meta["restored_digest"], written_digest=meta["digest"])
        if not self.strategy.is_chief:
            return
        if self.context.index == 0:
            plan.write_json(os.path.join(self.context.directory, plan.PLAN_FILE), self.context.plan_record())
        self.record["loss_at_start"] = cross_entropy(model(x_eval, training=False), y_eval)
        self._mark_switch(os.path.join(base, LOG_DIR, "train"))

    def _mark_switch(self, logdir: str) -> None:
        """A text summary naming the phase's mode and a ``phase`` scalar, at the phase's first
        epoch (the step Keras' epoch summaries use)."""
        import tensorflow as tf

        phase = self.context.phase
        step = phase.start_epoch
        text = (f"phase {phase.index}: {phase.mode} from epoch {phase.start_epoch} "
                f"(step {phase.start_epoch * self.steps_per_epoch}) to epoch {phase.end_epoch}")
        writer = tf.summary.create_file_writer(logdir)
        with writer.as_default():
            tf.summary.text("mode_switch", text, step=step)
            tf.summary.scalar("phase", float(phase.index), step=step)
        writer.flush()
        writer.close()

    def end(self, model, history, x_eval, y_eval) -> None:
        """After training, on the chief: the next checkpoint and this phase's History."""
        if not self.strategy.is_chief:
            return
        self.record["loss_at_end"] = cross_entropy(model(x_eval, training=False), y_eval)
        meta = checkpoint.save(model, self.context.checkpoint_out(), epoch=self.end_epoch,
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
