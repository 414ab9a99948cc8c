"""Resume after a failure: rerunning the same command with the same model directory continues
from the last completed epoch (model, optimizer with its exchange state, epoch), in every mode.

Keras' ``BackupAndRestore`` writes from every process that runs it, which several processes
of one job must not do to one directory: here the chief writes and every process restores
(and Horovod's initial broadcast then starts every rank from the chief's state). The backup is
kept when training ends, so rerunning a finished run trains no more epochs.
"""
from __future__ import annotations

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
            if self.writes is not False:
                super()._save_model()
