"""Resume after a failure: rerunning the same command with the same model directory continues
from the last completed epoch (model, optimizer with its exchange state, epoch), in every mode.

Keras' ``BackupAndRestore`` writes from every process that runs it, which several processes
of one job must not do to one directory: here the chief writes and every process restores
(and Horovod's initial broadcast then starts every rank from the chief's state). The backup is
kept when training ends, so rerunning a finished run trains no more epochs. Under Keras 3 the
weights and the epoch are each written to a temporary file and renamed into place, so a process
killed while writing leaves the previous backup whole (tf_keras' checkpoint manager already
does so): the weights go to a file named by the epoch, and the epoch's record, written last,
names that file, so weights and epoch always come from the same save.

A process restores in its first fit only: a later fit in the same process (a script that fits
again) goes on from the model it holds, which is at least as new as the backup. An elastic job
decides for every world's fit instead (:attr:`ResumeFromBackup.restores`): the backup is read
while the job has no commit yet, on every rank, joining ranks included, and never after, when
it would take the world back behind its last commit. The process that writes says in one line
where a fit resumed from the backup, and, when the backup left nothing to train, that the fit
trained nothing and why.
"""
from __future__ import annotations

import json
import os
import shutil

from absl import logging

from tfsyncmodes.keras.compat import LEGACY, keras


class ResumeFromBackup(keras.callbacks.BackupAndRestore):
    """``BackupAndRestore(backup_dir, delete_checkpoint=False)`` that writes only where `writes`.

    Under tf_keras with a multi-worker or parameter-server strategy, tf_keras coordinates the
    writers itself: pass ``writes=None`` there to leave it alone."""

    def __init__(self, backup_dir: str, writes=True):
        super().__init__(backup_dir, delete_checkpoint=False)
        self.writes = writes
        self.restores = None  # None: in this process's first fit only; True or False: in every fit, or in none
        self._fits = self._epochs_begun = 0
        self._restored = False
        self.saved = None  # Keras 3: (epochs done, the weights file) of this process's last save

    def on_train_begin(self, logs=None):
        self._restored = self._fits == 0 if self.restores is None else bool(self.restores)
        if self._restored:
            super().on_train_begin(logs)  # restores (and, under tf_keras, makes the state it saves with)
        elif LEGACY:  # the state it saves with, made as tf_keras makes it, not restored
            if getattr(self, "_training_state", None) is None:
                from tf_keras.src.distribute import worker_training_state

                self._training_state = worker_training_state.WorkerTrainingState(
                    self.model, self.backup_dir, self.save_freq, self.save_before_preemption)
            self.model._training_state = self._training_state
        self._fits += 1
        self._epochs_begun = 0

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        if self._restored and self._epochs_begun == 0 and epoch > 0 and self.writes is not False:
            logging.info("tfsyncmodes: resumed from %s at epoch %d of %s", self.backup_dir, epoch + 1,
                         (self.params or {}).get("epochs", "?"))
        self._epochs_begun += 1

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self._restored and self._epochs_begun == 0 and self.writes is not False and os.path.isdir(self.backup_dir):
            logging.warning("tfsyncmodes: the backup in %s has every epoch done, so this fit trained nothing "
                            "(remove it, or give another model directory, to train anew)", self.backup_dir)

    if LEGACY:
        def on_epoch_end(self, epoch, logs=None):
            if self.writes is not False:
                super().on_epoch_end(epoch, logs)
    else:
        def _save_model(self):
            if self.writes is False:
                return
            os.makedirs(self.backup_dir, exist_ok=True)
            name = f"epoch{self._current_epoch}-batch{self._last_batch_seen}.weights.h5"
            partial = os.path.join(self.backup_dir, "partial.weights.h5")
            self.model.save_weights(partial, overwrite=True)
            os.replace(partial, os.path.join(self.backup_dir, name))
            self._commit({"epoch": self._current_epoch, "batch": self._last_batch_seen, "weights": name})
            self.saved = (self._current_epoch, os.path.join(self.backup_dir, name))
            for old in os.listdir(self.backup_dir):  # the backups the record no longer names
                if old.endswith(".weights.h5") and old not in (name, "partial.weights.h5"):
                    os.remove(os.path.join(self.backup_dir, old))

        def _commit(self, record):
            """Makes `record` the backup: the one write a resume trusts (weights it does not
            name are from a save that did not finish)."""
            with open(self._training_metadata_path + ".partial", "w", encoding="utf-8") as handle:
                json.dump(record, handle)
            os.replace(self._training_metadata_path + ".partial", self._training_metadata_path)

        def _load_model(self):
            if os.path.exists(self._training_metadata_path):
                with open(self._training_metadata_path, encoding="utf-8") as handle:
                    named = json.load(handle).get("weights")
                if named:  # a backup written before the record named its weights keeps the default
                    self._weights_path = os.path.join(self.backup_dir, named)
            super()._load_model()


class CheckpointFromBackup(keras.callbacks.ModelCheckpoint):
    """``ModelCheckpoint(filepath, save_weights_only=True)`` that copies the weights file the
    resume backup (`backup`, a :class:`ResumeFromBackup` earlier in the callbacks) wrote at the
    same epoch's end, instead of reading every variable again: under a parameter server each
    read is a call to the servers while the workers wait for the next epoch. For a strategy
    whose callbacks change no weight between the two (``ModeStrategy.callbacks`` decides, in
    :mod:`tfsyncmodes.strategies.base`). Where the backup did not save that epoch (tf_keras writes its
    own format; a process that does not write it) it saves as ``ModelCheckpoint`` does. The
    copy goes to a temporary file renamed into place, so a process killed meanwhile leaves the
    previous checkpoint whole."""

    def __init__(self, filepath: str, backup: ResumeFromBackup):
        super().__init__(filepath, save_weights_only=True)
        self.backup = backup

    def _save_model(self, epoch, batch, logs):
        saved = self.backup.saved
        if batch is not None or saved is None or saved[0] != epoch + 1 or not os.path.isfile(saved[1]):
            return super()._save_model(epoch, batch, logs)
        partial = self.filepath + ".partial"
        try:
            shutil.copyfile(saved[1], partial)
            os.replace(partial, self.filepath)
        except OSError:  # a full disk: no partial copy left beside the last checkpoint
            if os.path.exists(partial):
                os.remove(partial)
            raise
        return None
