"""The exchange of a wrapped optimizer in a run that switches modes: one exchange per mode,
and a holder that runs the active one.

Every mode's exchange is built when the optimizer is (their state is optimizer state, so the
initial broadcast, checkpoints and ``model.save`` carry all of it). Each stage of a step is
delegated, when the step is traced, to the active exchange; after :meth:`switch` the train
function must be traced again (:class:`tfsyncmodes.switching.callback.ModeSwitch` does). The
optimizer wrapper knows only that its exchange can be swapped at a step boundary.

A switch, at a step boundary, on every rank:

1. the outgoing exchange is drained and finished: ``flush()`` then ``finish()`` (leaving
   hybrid: every rank moves to the mean of the groups' models); cross-group rounds that came
   in but were not applied are dropped (the mean replaces them);
2. leaving an exchange whose groups drifted apart (hybrid), the inner optimizer's float state
   (momenta, Adam's moments) is averaged over all ranks as the weights are, so that a sync
   phase starts with one model *and* one optimizer state on every rank and keeps them equal;
   its step counter (``iterations``) becomes the most any rank counted (speed-proportional
   local steps make the groups' counts differ);
3. the incoming exchange starts clean: its state is set to zero as at the start of training
   (the periodic policy re-takes its anchor on the next step and warms up again, error
   feedback starts empty), except the counters kept over the whole run (bytes sent).

Model weights and the inner optimizer's state otherwise carry over untouched.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import tensorflow as tf

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange import communicators
from tfsyncmodes.exchange.base import Chain, Part, optimizer_variables, reuse_state
from tfsyncmodes.exchange.clock import ComputeClock
from tfsyncmodes.exchange.policies import CrossGroupPolicy

# State a switch does not reset: the wire-traffic counters count over the whole run.
KEPT_STATE = ("bytes_sent", "bytes_sent_total", "exchange_steps")


class SwitchableExchange(Chain):
    """Runs ``exchanges[active]``; :meth:`switch` changes which one."""

    def __init__(self, exchanges: Dict[str, Chain], active: str):
        if active not in exchanges:
            raise ValueError(f"active mode {active!r} is not among {sorted(exchanges)}")
        self.exchanges = dict(exchanges)
        self.active = active
        self.variables: List = []
        self.inner_optimizer = None
        self.clock = ComputeClock()  # each rank's own compute, for the straggler policy
        self._state: Dict[str, List[Tuple[str, tf.Variable]]] = {m: [] for m in exchanges}

    @property
    def members(self) -> Tuple[Part, ...]:
        """The parts every Chain stage runs: the clock, then the active exchange."""
        return (self.clock, self.exchanges[self.active])

    def parts(self):
        """Every part the optimizer holds, of every mode's exchange (callbacks find the
        cross-group links through it in every phase; the stages run the active one only)."""
        return [self] + [p for exchange in self.exchanges.values() for p in exchange.parts()]

    def crosses_groups(self, mode: str = None) -> bool:
        """Whether `mode`'s exchange (the active one: None) exchanges across groups."""
        return bool(_cross_group_policies(self.exchanges[mode or self.active]))

    @property
    def modes(self) -> Tuple[str, ...]:
        return tuple(self.exchanges)

    @property
    def built(self) -> bool:
        return bool(self.variables)

    def attach(self, inner_optimizer):
        self.inner_optimizer = inner_optimizer
        for exchange in self.exchanges.values():
            exchange.attach(inner_optimizer)

    def build(self, variables, state):
        self.variables = list(variables)
        self.clock.build(self.variables, state)
        for mode, exchange in self.exchanges.items():
            def recorded(name, shape, dtype, _mode=mode):
                variable = state(name, shape, dtype)
                self._state[_mode].append((name, variable))
                return variable
            exchange.build(self.variables, recorded)

    def state_variables(self, mode: str = None) -> List[tf.Variable]:
        """The optimizer variables `mode`'s exchange created (every mode's: None)."""
        modes = [mode] if mode else list(self._state)
        return [v for m in modes for _, v in self._state[m]]

    def replace(self, mode: str, exchange: Chain) -> None:
        """Puts `exchange` in place of `mode`'s (e.g. the same mode over other groups), built
        over the state variables the old one created, name for name (they are optimizer
        state: checkpoints and the initial broadcast already know them)."""
        self._check(mode)
        if self.inner_optimizer is not None:
            exchange.attach(self.inner_optimizer)
        if self.built:
            exchange.build(self.variables, reuse_state(self._state[mode], f"rebuilt {mode} exchange"))
        self.exchanges[mode] = exchange

    def activate(self, mode: str) -> None:
        """Makes `mode` active as it is (the start of training, or a resumed run)."""
        self._check(mode)
        self.active = mode

    def switch(self, mode: str) -> bool:
        """Finishes the active exchange and starts `mode`'s clean (see the module doc).
        Eager, at a step boundary, on every rank. False if `mode` is active already."""
        self._check(mode)
        if mode == self.active:
            return False
        outgoing = self.exchanges[self.active]
        if self.built:
            outgoing.flush()
            outgoing.finish(self.variables)
            diverged = _cross_group_policies(outgoing)
            for policy in diverged:
                policy.discard_pending()
            if diverged:
                self._average_inner_state()
            for name, variable in self._state[mode]:
                if name not in KEPT_STATE:
                    variable.assign(tf.zeros_like(variable))
        self.active = mode
        return True

    def _average_inner_state(self) -> None:
        """The inner optimizer's float variables, averaged over all ranks."""
        own = {id(v) for v in self.state_variables()}
        variables = [v for v in optimizer_variables(self.inner_optimizer)
                     if id(v) not in own and tf.as_dtype(v.dtype).is_floating]
        if variables and communicators.horovod_world()[1] > 1:
            communicators.assign_world_mean(variables, "tfsync.switch.optimizer_state")
        # Groups that ran speed-proportional local steps counted different steps: every rank
        # continues from the most steps any rank ran (learning-rate schedules and Adam's bias
        # correction then agree on every rank).
        counters = [v for v in optimizer_variables(self.inner_optimizer)
                    if id(v) not in own and tf.as_dtype(v.dtype).is_integer and "iter" in v.name]
        if counters and communicators.horovod_world()[1] > 1:
            for counter in counters:
                every = communicators.world_allgather(tf.reshape(tf.cast(counter, tf.int64), [1]),
                                                      "tfsync.switch.iterations")
                counter.assign(tf.cast(tf.reduce_max(every), counter.dtype))

    def _check(self, mode: str) -> None:
        if mode not in self.exchanges:
            raise ConfigError("switch_to", "mode", f"{mode!r} is not a mode of this run",
                              "use one of: " + ", ".join(self.exchanges))


def _cross_group_policies(exchange: Chain) -> list:
    """The cross-group policies of `exchange` that exchange with other groups."""
    return [p for p in exchange.find(CrossGroupPolicy) if p.active]

