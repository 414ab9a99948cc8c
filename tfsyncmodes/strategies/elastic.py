"""Elastic sync and hybrid under ``horovodrun --min-np/--max-np --host-discovery-script`` (knob
``elastic``): ``fit`` driven by Horovod's own elastic loop (``horovod.common.elastic.run_fn``).

The state kept in memory is the model's and the optimizer's variables (the exchange's state
included: it is optimizer variables), the epoch, the step within it, the world size at start
and the committed epoch logs. It is committed at every epoch's end, and every
``elastic_commit`` steps when that is a number. When a rank is lost, the collectives of the
others fail; they restore the last commit, Horovod re-forms the world without the lost rank,
and training goes on from the committed step. When the discovery script adds a rank, every rank
stops at the next commit, the world is re-formed and the new rank receives rank 0's state (a
broadcast). Each attempt re-makes the dataset, so the data are sharded over the new world; the
learning rate follows ``elastic_lr``. Each change is one line on rank 0,
``tfsyncmodes: world 3 -> 2 at epoch E step S``, and the History's ``world_size`` per epoch.

What a mode adds goes through the strategy's hooks: ``elastic_restart`` (Horovod started again
after a reset; hybrid makes its groups again, and the line names them), ``elastic_commit_point``
(whether a commit may land after this step; hybrid: a round boundary), ``elastic_resized``
(on every rank once a new world holds rank 0's state; hybrid: the exchange starts clean) and
``elastic_part_epoch`` (a part-done epoch begins; hybrid: its policies hear the steps done), see
:mod:`tfsyncmodes.strategies.elastic_hybrid`.
"""
from __future__ import annotations

import contextlib
import sys

import numpy as np
import tensorflow as tf

from tfsyncmodes.exchange import communicators
from tfsyncmodes.exchange.base import optimizer_variables
from tfsyncmodes.keras.callbacks import BroadcastInitialState
from tfsyncmodes.keras.compat import build_metrics, build_optimizer, keras
from tfsyncmodes.keras.resume import ResumeFromBackup
from tfsyncmodes.strategies.step_deadline import StepDeadline

_LOST = ("horovod", "gloo")  # words in the message of a collective that failed with a peer
DEADLINE_TIMEOUTS = 4  # a step may last this many collective timeouts (StepDeadline)
# ... and never less than this: after a world change a rank waits in its first rounds for the
# others' tracing (a hybrid job's exchange is traced at its first round, past the untimed steps);
# at a 2 s collective timeout, 8 s ended three ranks of a 4-rank hybrid chaos run that way.
DEADLINE_FLOOR_S = 30.0


@contextlib.contextmanager
def lost_peers_as_internal_errors():
    """A collective that failed with a peer (its message names Horovod or Gloo) raised as
    Horovod's ``HorovodInternalError``, which its elastic loop answers with a rollback and a
    new rendezvous; any other error as it is."""
    from horovod.common.exceptions import HorovodInternalError

    try:
        yield
    except tf.errors.OpError as error:
        if any(word in str(error.message).lower() for word in _LOST):
            raise HorovodInternalError(error) from None
        raise


def elastic_state(model, **values):
    """Horovod's ``State`` over a Keras model: weights, optimizer variables and `values`."""
    from horovod.common.elastic import ObjectState
    import horovod.tensorflow as hvd

    class _State(ObjectState):
        def __init__(self):
            self.model = model
            self._snapshot()
            super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **values)

        def _variables(self):
            return list(self.model.variables) + optimizer_variables(self.model.optimizer)

        def _snapshot(self):
            self._saved = [tf.identity(v) for v in self._variables()]

        def save(self):
            self._snapshot()
            super().save()

        def restore(self):
            for variable, value in zip(self._variables(), self._saved):
                variable.assign(value)
            super().restore()

        def sync(self):
            # Horovod's elastic loop syncs the state inside its retry: a peer lost during the
            # broadcast must reach it as a lost rank (HorovodInternalError), as one lost in a step.
            with lost_peers_as_internal_errors():
                communicators.broadcast_variables(self._variables(), 0, "tfsync.elastic")
                self._snapshot()
                super().sync()

    return _State()


class EndPartEpoch(keras.callbacks.Callback):
    """Ends a part-done first epoch (resumed at step `first` of `steps`) after its remaining
    steps, so that one ``fit`` runs it and the epochs after it: a second ``fit`` would cost each
    rank a new fit's start and, in hybrid, the drain of the exchange that ends a fit. Keras ends
    an epoch early on ``stop_training``; this callback clears it again at that epoch's end. It
    goes first in the list, so that a later callback may still stop the training there."""

    def __init__(self, first: int, steps: int):
        super().__init__()
        self.first, self.steps, self._stopped = first, steps, False

    def on_train_batch_end(self, batch, logs=None):
        if self.first and self.first + batch + 1 >= self.steps:
            self.model.stop_training = self._stopped = True

    def on_epoch_end(self, epoch, logs=None):
        self.first = 0
        if self._stopped:  # the part-done epoch ended; training goes on
            self.model.stop_training = self._stopped = False


class WorldSize(keras.callbacks.Callback):
    """Adds ``world_size`` (Horovod's size) to each epoch's logs. It goes first in the list, so
    that the callbacks after it (TensorBoard, a CSV logger, the History, the commit) see it."""

    def on_epoch_end(self, epoch, logs=None):
        import horovod.tensorflow as hvd

        if logs is not None:
            logs["world_size"] = float(hvd.size())


class ElasticCommit(keras.callbacks.Callback):
    """Counts the steps of an attempt, commits the state at epoch ends (and every `every`
    steps) and keeps the committed epoch logs. A commit
    waits for a step after which `commit_point()` is true (hybrid: a round boundary).

    No commit lands on an epoch's last step (of `steps`): the epoch's end commits right after.
    A world change noticed there would resume at step `steps` of an epoch with no step left,
    and that epoch would still run a step (EndPartEpoch ends it after its first): a step too
    many. (When the part-done epoch had a fit of its own, Keras 3 read its
    ``steps_per_epoch=0`` as "until the data end": the data repeat, a hang.)"""

    def __init__(self, state, every, first_step: int, steps: int, commit_point=lambda: True,
                 part_epoch=lambda steps, done: None):
        super().__init__()
        self.state, self.every, self.first_step, self.steps = state, every, first_step, steps
        self.commit_point, self.part_epoch, self.due = commit_point, part_epoch, False

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_step:  # after the other callbacks' epoch begin: the mode hears the steps done
            self.part_epoch(self.steps, self.first_step)

    def _commit(self):
        if self.commit_point():
            self.due = False
            self.state.commit()
        else:
            self.due = True

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = self.first_step + batch + 1
        if self.state.batch >= self.steps:
            return
        if self.due or (self.every != "epoch" and self.state.batch % int(self.every) == 0):
            self._commit()

    def on_epoch_end(self, epoch, logs=None):
        self.state.logs = self.state.logs + [(epoch, {k: float(v) for k, v in (logs or {}).items()})]
        self.state.epoch, self.state.batch, self.first_step = epoch + 1, 0, 0
        self._commit()


def fit(strategy, model, dataset_fn, *, epochs, steps_per_epoch, callbacks, verbose):
    """``strategy.fit`` in elastic sync: the History of every committed epoch."""
    import horovod.tensorflow as hvd
    from horovod.common.elastic import run_fn

    if steps_per_epoch is None:
        raise ValueError("elastic sync needs steps_per_epoch (the state counts steps)")
    # Built before the state is made: a rank that joins later must list the same variables
    # (slots, exchange state) as the ranks that trained already.
    build_optimizer(model)
    build_metrics(model, strategy.distribute_datasets_from_function(dataset_fn))  # traced once per world
    rate = model.optimizer.learning_rate
    state = elastic_state(model, epoch=0, batch=0, start_size=hvd.size(), world=hvd.size(),
                          base_lr=float(np.asarray(rate)), logs=[])
    config = strategy.config
    last = {"groups": ""}
    deadline = StepDeadline(max(DEADLINE_TIMEOUTS * config.collective_timeout, DEADLINE_FLOOR_S))

    def attempt(state):
        size = hvd.size()
        if state.world != size:
            if hvd.rank() == 0:
                print(f"tfsyncmodes: world {state.world} -> {size} at epoch {state.epoch} "
                      f"step {state.batch}{last['groups']}", file=sys.stderr, flush=True)
            state.world = size
            strategy.elastic_resized(model)
            # Kept as the state to roll back to (it is the last commit's, in the new world): a
            # rank lost before the next commit then reads "world <this> -> ...", not the
            # committed world's size.
            state.save()
        if config.elastic_lr == "scale":
            model.optimizer.learning_rate.assign(state.base_lr * size / state.start_size)
        if state.epoch >= epochs:
            return last.get("history")
        first = state.batch
        commit = ElasticCommit(state, config.elastic_commit, first, steps_per_epoch,
                               lambda: strategy.elastic_commit_point(model),
                               lambda steps, done: strategy.elastic_part_epoch(model, steps, done))
        # Every rank of a world runs the same collectives at its fit's start: the initial
        # broadcast afresh in every world (a caller's, from strategy.callbacks(), has run in the
        # survivors' first world and would skip, where a joining rank's would not), and the
        # backup read by every rank while the job has no commit, by none after (the state is
        # newer: the survivors would go back behind it, a joining rank start elsewhere).
        user = [c for c in callbacks if not isinstance(c, BroadcastInitialState)]
        for callback in user:
            if isinstance(callback, ResumeFromBackup):
                callback.restores = not (state.epoch or state.batch)
        # One fit: a part-done first epoch ends after its remaining steps (EndPartEpoch).
        dataset = strategy.distribute_datasets_from_function(dataset_fn)
        last["history"] = model.fit(
            dataset, epochs=epochs, initial_epoch=state.epoch, steps_per_epoch=steps_per_epoch,
            shuffle=False, verbose=verbose,
            callbacks=[EndPartEpoch(first, steps_per_epoch), WorldSize()]
            + strategy.with_required_callbacks(user) + [commit, deadline])
        return last.get("history")

    def guarded(state):
        try:
            with lost_peers_as_internal_errors():
                return attempt(state)
        finally:
            deadline.idle()  # a failed step's fit ends without its batch end: the rank waits at the rendezvous

    def reset():
        hvd.shutdown()
        last["groups"] = strategy.elastic_restart(model)
        # The train function was traced in the old world: trace it again.
        model.train_function = None
        if hasattr(model, "make_train_function"):
            model.make_train_function(force=True)

    history = run_fn(guarded, reset)(state)
    if history is None:
        history = keras.callbacks.History()
        history.set_model(model)
    history.epoch = [epoch for epoch, _ in state.logs]
    history.history = {}
    for _, logs in state.logs:
        for key, value in logs.items():
            history.history.setdefault(key, []).append(value)
    return history
