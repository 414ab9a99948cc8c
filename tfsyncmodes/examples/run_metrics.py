"""What the example trainer reports about a run beyond Keras's History (no flags: importable
anywhere)."""
from __future__ import annotations


def trained_samples(logs: dict, steps: int, steps_per_epoch: int, batch_size: int) -> int:
    """Samples every replica trained on: steps x the global batch, or, with speed-proportional
    local steps (each group's inner steps per round and the rounds in every epoch's logs), the
    sum over groups of their steps x the group's share of the global batch. An epoch without
    rounds (a switching run's sync epochs) counts `steps_per_epoch` global batches; the sync
    steps of an epoch that switched into hybrid midway are not counted."""
    groups = sorted(k for k in logs if k.startswith("local_steps_group"))
    rounds = logs.get("local_steps_rounds", [])
    if not groups or not any(float(r) for r in rounds):
        return int(steps) * batch_size
    per_group = batch_size / len(groups)
    epochs = len(logs.get("loss", rounds))
    total = max(0, epochs - len(rounds)) * steps_per_epoch * batch_size  # epochs before the first logged
    for e, done in enumerate(rounds):
        if float(done):
            total += sum(float(logs[g][e]) * float(done) * per_group for g in groups)
        else:
            total += steps_per_epoch * batch_size
    return int(round(total))
