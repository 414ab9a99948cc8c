"""Resume after a failure: rerunning the same command with the same model directory continues
from the last completed epoch (model, optimizer with its exchange state, epoch), in every mode.

Keras' ``BackupAndRestore`` writes from every process that runs it, which several processes
of one job must not do to one directory: here the chief writes and every process restores
(and Horovod's initial broadcast then starts every rank from the chief's state). The backup is
kept when training ends, so rerunning a finished run trains no more epochs. Under Keras 3 the
weights and the epoch are each written to a temporary file and renamed into place, so a process
killed while writing leaves the previous backup whole (tf_keras' checkpoint manager already
does so).
"""
from __future__ import annotations

import json
import os

from tfsyncmodes.keras.compat import LEGACY, keras


class ResumeFromBackup(keras.callbacks.BackupAndRestore):
    """``BackupAndRestore(backup_dir, delete_checkpoint=False)`` that writes only where `writes`.

    Under tf_keras with a multi-worker or parameter-server strategy, tf_keras coordinates the
    writers itself: pass ``writes=None`` there to leave it alone."""

    def __init__(self, backup_dir: str, writes=True):
        super().__init__(backup_dir, delete_checkpoint=False)
        self.writes = writes

    if LEGACY:
        def on_epoch_end(self, epoch, logs=None):
            if self.writes is not False:
                super().on_epoch_end(epoch, logs)
    else:
        def _save_model(self):
            if self.writes is False:
                return
            os.makedirs(self.backup_dir, exist_ok=True)
            partial = os.path.join(self.backup_dir, "partial.weights.h5")
            self.model.save_weights(partial, overwrite=True)
            os.replace(partial, self._weights_path)
            with open(self._training_metadata_path + ".partial", "w", encoding="utf-8") as handle:
                json.dump({"epoch": self._current_epoch, "batch": self._last_batch_seen}, handle)
            os.replace(self._training_metadata_path + ".partial", self._training_metadata_path)
