"""A mode-neutral checkpoint: what one phase of a mode schedule hands the next.

Between a ``horovodrun`` job and a parameter-server cluster nothing of a strategy survives:
variables live on different devices (a rank's CPU, a ps task), and a wrapped optimizer's
exchange state (error-feedback residuals, averaging anchors, version counters) belongs to one
mode. What carries over is what every mode means the same way:

- the model's weights, in the model's order (``model/0000`` ...);
- the inner optimizer's variables (its step counter ``iteration``, learning rate, slots such as
  SGD's momentum or Adam's moments), in that optimizer's order (``optimizer/0000`` ...), none of
  the wrapper's exchange state;
- the epoch the next phase starts at, and the mode and phase that wrote it.

Variables are keyed by position, as Keras' own weight files key them: their paths carry
process-wide counters (``sequential_1/dense_2/kernel``) that differ with what a process built
before. Each variable's path or name and the optimizer's class are in the metadata, so a
phase built with another model or optimizer class is told so by name.

The chief writes one ``.npz`` file (a temporary file, then renamed into place: a process
killed mid-write leaves no half checkpoint); every process of the next phase reads it, inside
its strategy's scope, before training (under ``ParameterServerStrategy`` the chief assigns
the values to the variables on the ps tasks). :func:`digest` fingerprints values so that a
reader can prove it holds what was written.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from typing import Dict, List, Mapping, Tuple

import numpy as np

from tfsyncmodes.errors import ConfigError

META = "__meta__"
MODEL, OPTIMIZER = "model/", "optimizer/"


def inner_optimizer(optimizer):
    """The optimizer doing the update: the Keras 3 wrapper's ``inner_optimizer``, else itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def _name(variable) -> str:
    name = getattr(variable, "path", None) or getattr(variable, "name", "")
    return name[:-2] if name.endswith(":0") else name


def named_variables(model) -> List[Tuple[str, object]]:
    """(key, variable) for the model's weights and the inner optimizer's variables, in their
    order; the optimizer must be built."""
    out = [(f"{MODEL}{i:04d}", v) for i, v in enumerate(model.weights)]
    if model.optimizer is not None:
        out += [(f"{OPTIMIZER}{i:04d}", v) for i, v in enumerate(inner_optimizer(model.optimizer).variables)]
    return out


def describe(model) -> Dict[str, object]:
    """What the keys stand for: each variable's path or name, and the optimizer's class."""
    optimizer = inner_optimizer(model.optimizer) if model.optimizer is not None else None
    return {"names": {key: _name(v) for key, v in named_variables(model)},
            "optimizer": type(optimizer).__name__ if optimizer is not None else None}


def build_optimizer(model, strategy=None) -> None:
    """Creates the optimizer's variables (inside `strategy`'s scope: on the ps tasks in async)."""
    optimizer = model.optimizer
    if optimizer is None or getattr(optimizer, "built", True):
        return
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        optimizer.build(model.trainable_variables)


def values(model) -> Dict[str, np.ndarray]:
    """Every carried variable's value, read to this process (from the ps tasks in async)."""
    return {key: np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable)
            for key, variable in named_variables(model)}


def digest(arrays: Mapping[str, np.ndarray]) -> str:
    """A fingerprint of the values in key order (dtype, shape and bytes of each)."""
    hasher = hashlib.sha256()
    for key in sorted(arrays):
        array = np.ascontiguousarray(arrays[key])
        hasher.update(f"{key}|{array.dtype.str}|{array.shape}|".encode())
        hasher.update(array.tobytes())
    return hasher.hexdigest()[:16]


def save(model, path: str, **meta) -> Dict[str, object]:
    """Writes the model's and inner optimizer's values and `meta` (e.g. ``epoch``, ``mode``,
    ``phase``) to `path` atomically; returns the metadata written (with ``step`` and
    ``digest``)."""
    arrays = values(model)
    optimizer = model.optimizer
    step = int(np.asarray(optimizer.iterations)) if optimizer is not None else None
    meta = dict(meta, step=step, digest=digest(arrays), **describe(model))
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=".partial-", suffix=".npz", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            np.savez(out, **{META: np.array(json.dumps(meta))}, **arrays)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return meta


def load(path: str) -> Tuple[Dict[str, object], Dict[str, np.ndarray]]:
    """(metadata, arrays) of a checkpoint file."""
    if not os.path.isfile(path):
        raise ConfigError("checkpoint", path, "does not exist",
                          "run the phases in order through python -m tfsyncmodes.launch")
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files if key != META}
        meta = json.loads(str(data[META]))
    return meta, arrays


def restore(model, path: str, strategy=None) -> Dict[str, object]:
    """Assigns a checkpoint's values to `model` and its inner optimizer (built first, in
    `strategy`'s scope). Every carried variable must be in the file with its shape; the
    wrapper's own exchange state starts afresh. Returns the checkpoint's metadata with
    ``restored_digest``, the fingerprint of the values read back from the variables."""
    meta, arrays = load(path)
    build_optimizer(model, strategy)
    pairs = named_variables(model)
    mine = describe(model)
    if meta.get("optimizer") != mine["optimizer"]:
        raise ConfigError("checkpoint", path, f"holds a {meta.get('optimizer')} optimizer's state, this "
                          f"phase's optimizer is {mine['optimizer']}", "use one optimizer class in every phase")
    if sorted(arrays) != sorted(key for key, _ in pairs):
        raise ConfigError("checkpoint", path, f"holds {len(arrays)} variables, this phase's model and "
                          f"optimizer have {len(pairs)}", "train every phase with the same model")
    for key, variable in pairs:
        value = arrays[key]
        if tuple(value.shape) != tuple(variable.shape):
            raise ConfigError("checkpoint", path, f"{meta['names'].get(key, key)!r} has shape {value.shape}, "
                              f"this phase's {mine['names'][key]!r} has {tuple(variable.shape)}",
                              "train every phase with the same model")
        variable.assign(value.astype(np.dtype(_dtype(variable))))
    return dict(meta, restored_digest=digest(values(model)))


def _dtype(variable) -> str:
    dtype = variable.dtype
    return getattr(dtype, "name", None) or str(dtype)
