"""The registries: every pluggable part of tfsyncmodes, found by the name a user gives.

| registry | the knob that names it | what a name maps to | built-in parts live in |
|---|---|---|---|
| :data:`MODES` | ``--sync_mode`` | a :class:`tfsyncmodes.strategies.base.Mode` | ``strategies/{sync,hybrid,parameter_server}.py`` |
| :data:`BACKENDS` | ``--sync_backend`` | a sync-mode strategy class | ``strategies/{horovod,mirrored}.py`` |
| :data:`COMPRESSORS` | ``--compression`` | a :class:`~tfsyncmodes.exchange.compressors.Compressor` class | ``exchange/compressors.py`` |
| :data:`MEMORIES` | ``--error_feedback`` | a :class:`~tfsyncmodes.exchange.memory.Memory` class | ``exchange/memory.py`` |
| :data:`CROSS_GROUP` | ``--cross_group`` | a :class:`~tfsyncmodes.exchange.policies.CrossGroupPolicy` class | ``exchange/policies.py``, ``exchange/elastic.py`` |
| :data:`OUTER_OPTIMIZERS` | ``--outer_optimizer`` | an outer optimizer class (``step(anchor, mean_change)``) | ``exchange/outer.py`` |
| :data:`SWITCH_PLANS` | ``--mode_schedule`` (and switch policies) | a :class:`~tfsyncmodes.switching.plans.SwitchPlan` class | ``switching/plans.py`` |

A new part is one module with one ``@REGISTRY.register("name")`` (and, for a part outside
this package, an import of that module before the configuration is resolved). The config's
accepted values and the flags' help text are read from here, so a registered name is
accepted everywhere at once.
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict, Iterable, Tuple, TypeVar

from tfsyncmodes.errors import ConfigError, one_of

T = TypeVar("T")


class Registry:
    """Names to parts of one kind. Built-in parts register when their modules are imported,
    which happens on the first look-up."""

    def __init__(self, kind: str, builtins: Iterable[str] = ()):
        self.kind = kind
        self._builtins: Tuple[str, ...] = tuple(builtins)
        self._parts: Dict[str, object] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        def add(part: T) -> T:
            if name in self._parts and self._parts[name] is not part:
                raise ValueError(f"a {self.kind} named {name!r} is registered already")
            self._parts[name] = part
            return part
        return add

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for module in self._builtins:
                importlib.import_module(module)

    def names(self) -> Tuple[str, ...]:
        self._load()
        return tuple(self._parts)

    def get(self, name: str, source: str = "argument", field: str = ""):
        """The part registered as `name`; a ConfigError naming `source` and `field` if none."""
        self._load()
        try:
            return self._parts[name]
        except KeyError:
            raise ConfigError(source, field or self.kind, f"{name!r} is not accepted",
                              one_of(self._parts)) from None


MODES = Registry("mode", ["tfsyncmodes.strategies.sync", "tfsyncmodes.strategies.parameter_server",
                          "tfsyncmodes.strategies.hybrid", "tfsyncmodes.switching.auto_mode"])
BACKENDS = Registry("backend", ["tfsyncmodes.strategies.horovod", "tfsyncmodes.strategies.mirrored"])
COMPRESSORS = Registry("compression", ["tfsyncmodes.exchange.compressors"])
MEMORIES = Registry("memory", ["tfsyncmodes.exchange.memory"])
CROSS_GROUP = Registry("cross_group", ["tfsyncmodes.exchange.policies", "tfsyncmodes.exchange.elastic"])
OUTER_OPTIMIZERS = Registry("outer_optimizer", ["tfsyncmodes.exchange.outer"])
SWITCH_PLANS = Registry("switch plan", ["tfsyncmodes.switching.plans", "tfsyncmodes.switching.policy"])
