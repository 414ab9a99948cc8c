"""The registries: every pluggable part of tfsyncmodes, found by the name a user gives.

| registry | the knob that names it | what a name maps to | built-in parts live in |
|---|---|---|---|
| :data:`MODES` | ``--sync_mode`` | a :class:`tfsyncmodes.strategies.base.Mode` | ``strategies/{sync,hybrid,parameter_server,auto}.py`` |
| :data:`BACKENDS` | ``--sync_backend`` | a sync-mode strategy class | ``strategies/{horovod,mirrored}.py`` |
| :data:`COMPRESSORS` | ``--sync_compression`` | a :class:`~tfsyncmodes.exchange.compressors.Compressor` class | ``exchange/compressors.py``, ``exchange/quantized.py`` |
| :data:`MEMORIES` | ``--sync_error_feedback``, ``--sync_dgc`` | a :class:`~tfsyncmodes.exchange.memory.Memory` class | ``exchange/memory.py``, ``exchange/dgc.py`` |
| :data:`CROSS_GROUP` | ``--sync_cross_group`` | a :class:`~tfsyncmodes.exchange.policies.CrossGroupPolicy` class | ``exchange/policies.py``, ``exchange/elastic.py`` |
| :data:`OUTER_OPTIMIZERS` | ``--sync_outer_optimizer`` | an outer optimizer class (``step(anchor, mean_change)``) | ``exchange/outer.py`` |
| :data:`SWITCH_PLANS` | ``--sync_mode_schedule``, ``--sync_switch_policy`` | a :class:`~tfsyncmodes.switching.plans.SwitchPlan` class | ``switching/plans.py``, ``switching/policy.py``, ``switching/auto_policy.py`` |

Each registry declares its built-in parts statically, as ``name -> "module:attribute"``: their
names are known without importing anything (the flags list them, the knobs accept them), and a
part's module is imported the first time :meth:`Registry.get` asks for it, so what a registry
holds does not depend on what was imported before. A built-in module's
``@REGISTRY.register("name")`` must register the declared attribute. A part outside this
package is one ``@REGISTRY.register("name")`` in a module imported before the configuration
is resolved; it is accepted everywhere at once (the flags' help lists the built-in names).
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict, Mapping, Tuple, TypeVar

from tfsyncmodes.errors import ConfigError, one_of

T = TypeVar("T")


class Registry:
    """Names to parts of one kind: built-ins declared as ``"module:attribute"`` (imported on
    the first :meth:`get` of one of them), and parts registered with :meth:`register`."""

    def __init__(self, kind: str, builtins: Mapping[str, str] = None):
        self.kind = kind
        self._builtins: Dict[str, str] = dict(builtins or {})
        self._parts: Dict[str, object] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(part: T) -> T:
            declared = self._builtins.get(name)
            where = f"{getattr(part, '__module__', '?')}:{getattr(part, '__qualname__', '?')}"
            if declared is not None and declared != where:
                raise ValueError(f"{name!r} is the built-in {self.kind} {declared}; register {where} "
                                 "under another name")
            if name in self._parts and self._parts[name] is not part:
                raise ValueError(f"a {self.kind} named {name!r} is registered already")
            self._parts[name] = part
            return part
        return add

    def names(self) -> Tuple[str, ...]:
        """Built-in names first (in declaration order), then registered ones; imports nothing."""
        return tuple(self._builtins) + tuple(n for n in self._parts if n not in self._builtins)

    def get(self, name: str, source: str = "argument", field: str = ""):
        """The part registered as `name`; a ConfigError naming `source` and `field` if none."""
        if name not in self._parts and name in self._builtins:
            module, _, attribute = self._builtins[name].partition(":")
            self._parts[name] = getattr(importlib.import_module(module), attribute)
        try:
            return self._parts[name]
        except KeyError:
            raise ConfigError(source, field or self.kind, f"{name!r} is not accepted",
                              one_of(self.names())) from None


_S, _X, _W = "tfsyncmodes.strategies.", "tfsyncmodes.exchange.", "tfsyncmodes.switching."
MODES = Registry("mode", {"sync": _S + "sync:SyncMode", "async": _S + "parameter_server:AsyncMode",
                          "hybrid": _S + "hybrid:HybridMode", "auto": _W + "auto_mode:AutoMode"})
BACKENDS = Registry("backend", {"horovod": _S + "horovod:HorovodStrategy",
                                "multi_worker": _S + "mirrored:MultiWorkerStrategy",
                                "mirrored": _S + "mirrored:MirroredStrategy"})
COMPRESSORS = Registry("compression", {"none": _X + "compressors:NoCompression", "fp16": _X + "compressors:FP16",
                                       "topk": _X + "compressors:TopK", "int8": _X + "quantized:Int8",
                                       "int4": _X + "quantized:Int4", "int2": _X + "quantized:Int2",
                                       "topk_int8": _X + "quantized:TopKInt8", "topk_int4": _X + "quantized:TopKInt4",
                                       "topk_int2": _X + "quantized:TopKInt2"})
MEMORIES = Registry("memory", {"none": _X + "memory:NoMemory", "residual": _X + "memory:ErrorFeedback",
                               "dgc": _X + "dgc:MomentumCorrection"})
CROSS_GROUP = Registry("cross_group", {"stale": _X + "policies:StaleExchange", "periodic": _X + "policies:PeriodicAverage",
                                       "elastic": _X + "elastic:ElasticAverage"})
OUTER_OPTIMIZERS = Registry("outer_optimizer", {"average": _X + "outer:AverageOuter",
                                                "nesterov": _X + "outer:NesterovOuter"})
SWITCH_PLANS = Registry("switch plan", {"schedule": _W + "plans:SchedulePlan", "straggler": _W + "policy:StragglerPlan",
                                        "auto": _W + "auto_policy:AutoPlan"})
