"""Callbacks hybrid mode adds: wire traffic in the logs, and draining the cross-group exchange
at the end of training.

Both use the wrapped optimizer's public ``exchange`` (Keras 3 and tf_keras alike), and the
public methods of its cross-group policies and their links.
"""
from __future__ import annotations

from tfsyncmodes.exchange.policies import CrossGroupPolicy
from tfsyncmodes.keras.compat import keras


def _links(model):
    """The cross-group links of the model's optimizer that exchange with other groups."""
    exchange = getattr(getattr(model, "optimizer", None), "exchange", None)
    if exchange is None:
        return []
    return [p.link for p in exchange.find(CrossGroupPolicy) if p.active]


class WireTrafficLogger(keras.callbacks.Callback):
    """Adds ``bytes_sent`` (cross-group payload bytes this rank sent) and
    ``compression_ratio`` (those bytes over what a float32 exchange sends) to the logs: per
    step in batch logs, averaged over the epoch's steps in epoch logs (and so in History).
    With ``cross_group=stale`` also ``cross_group_lag``: how many steps late the other
    groups' updates are (rounds handed over but not applied yet; at most ``staleness``). Batch
    logs are this rank's; epoch logs are then averaged over all ranks (``MetricAverage``)."""

    def __init__(self):
        super().__init__()
        self._epoch_start = (0, 0)
        self._lags = []

    def _counts(self):
        links = _links(self.model)
        return (links[0], links[0].traffic_counts()) if links else (None, None)

    def on_epoch_begin(self, epoch, logs=None):
        self._lags = []
        _, counts = self._counts()
        if counts is not None:
            self._epoch_start = counts

    def on_train_batch_end(self, batch, logs=None):
        # Every step: one look-up of the exchange, and only the counters the batch logs show.
        links = _links(self.model) if logs is not None else []
        sent = links[0].bytes_sent() if links else None
        if sent is None:
            return
        logs["bytes_sent"] = float(sent)
        logs["compression_ratio"] = float(sent) / links[0].dense_bytes
        lag = links[0].lag()
        if lag is not None:
            self._lags.append(lag)
            logs["cross_group_lag"] = float(self._lags[-1])

    def on_epoch_end(self, epoch, logs=None):
        link, counts = self._counts()
        if counts is None or logs is None:
            return
        total, steps = counts
        steps -= self._epoch_start[1]
        if steps > 0:
            per_step = (total - self._epoch_start[0]) / steps
            logs["bytes_sent"] = per_step
            logs["compression_ratio"] = per_step / link.dense_bytes
        if self._lags:
            logs["cross_group_lag"] = sum(self._lags) / len(self._lags)


class DrainExchange(keras.callbacks.Callback):
    """At the end of training, waits until this rank has done its part in every cross-group
    round it started, so that no peer is left waiting for it, and then every rank moves to
    the mean of the groups' models.

    Callbacks that act at an epoch's end (``ModelCheckpoint``) see the group's own model, not
    the mean; the final model is the mean. With ``cross_group=stale``, rounds that came in but
    were not applied yet (at most `staleness` per group) are not in the mean: a later
    ``fit()`` applies them at its first step.

    Around the epochs it tells the cross-group policies each epoch's number of steps, ends an
    epoch early where the groups agreed it ends (``--sync_local_steps=auto``: the epoch ends at the
    round where the first group has run all its steps), and adds the policies' epoch logs
    (``local_steps_group<g>``: inner steps group g ran per round, ``local_steps_rounds``)."""

    def __init__(self):
        super().__init__()
        self._stopped = False
        self._found = None

    def _policies(self):
        exchange = getattr(getattr(self.model, "optimizer", None), "exchange", None)
        return [] if exchange is None else exchange.find(CrossGroupPolicy)

    def on_train_begin(self, logs=None):
        self._found = self._policies()

    def on_epoch_begin(self, epoch, logs=None):
        self._stopped = False
        steps = (self.params or {}).get("steps")
        self._found = self._policies()  # a switch may have put other policies in place
        for policy in self._found:
            policy.begin_epoch(steps)

    def on_train_batch_end(self, batch, logs=None):
        steps = (self.params or {}).get("steps")
        self._found = self._policies()
        for policy in self._found:
            if policy.ends_epoch() and steps and batch + 1 < steps:
                self.model.stop_training = self._stopped = True

    def on_epoch_end(self, epoch, logs=None):
        for policy in self._found or []:
            if logs is not None:
                logs.update(policy.epoch_logs())
        if self._stopped:  # this epoch ended early; training goes on
            self.model.stop_training = self._stopped = False

    def on_train_end(self, logs=None):
        finish = getattr(getattr(self.model, "optimizer", None), "finish_exchange", None)
        if finish is not None:
            finish()
