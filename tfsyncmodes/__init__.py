"""tfsyncmodes: switch TensorFlow/Keras data-parallel training between sync, async and hybrid
replica synchronisation with one flag.

    strategy = tfsyncmodes.make_strategy()          # --sync_mode / TFSYNC_MODE / config file
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.Adam(1e-3)), ...)
    strategy.fit(model, dataset_fn, epochs=5, steps_per_epoch=100)

Importing the package imports TensorFlow and Keras, defines the ``--sync_*`` flags and registers
the wrapper classes ``load_model`` needs. A process started as ``python -m tfsyncmodes.launch``
or ``python -m tfsyncmodes.advise`` (tools that start or price jobs and need no TensorFlow)
does none of that: the public names below are then imported where first used.
"""
import importlib as _importlib
import sys as _sys

__version__ = "0.1.0"
__all__ = ["ConfigError", "ModeStrategy", "SyncConfig", "make_strategy", "resolve", "run", "wrap"]

_PUBLIC = {"ConfigError": "tfsyncmodes.errors", "run": "tfsyncmodes.errors", "SyncConfig": "tfsyncmodes.config",
           "resolve": "tfsyncmodes.config", "wrap": "tfsyncmodes.keras", "ModeStrategy": "tfsyncmodes.strategies",
           "make_strategy": "tfsyncmodes.strategies"}
_WITHOUT_TENSORFLOW = ("tfsyncmodes.launch", "tfsyncmodes.advise")


def _module_run(argv) -> str:
    """The module an interpreter's command line `argv` (``sys.orig_argv``) runs with ``-m``, or ''
    (a script, ``-c``, standard input), read as CPython reads its options: short ones may be
    combined (``-um``), and ``c``, ``m``, ``W`` and ``X`` take the rest of their word or the next."""
    words = iter(argv[1:])
    for word in words:
        if word == "--check-hash-based-pycs":  # the one long option with a value
            next(words, None)
            continue
        if word in ("-", "--") or not word.startswith("-") or word.startswith("--"):
            return ""  # standard input, a script (after "--" too), or an option that runs nothing
        for at, letter in enumerate(word[1:], 2):
            if letter in "cmWX":
                value = word[at:] or next(words, "")
                if letter in "cm":
                    return value if letter == "m" else ""
                break
    return ""


def __getattr__(name):
    """The public names, imported on first use in a tool's process (PEP 562)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tfsyncmodes' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


if _module_run(getattr(_sys, "orig_argv", ())) not in _WITHOUT_TENSORFLOW:
    from tfsyncmodes import _requirements  # noqa: F401  (a clear error when TensorFlow is missing)
    from tfsyncmodes import flags as _flags  # noqa: F401  (defines --sync_mode and the other knobs)
    from tfsyncmodes.config import SyncConfig, resolve
    from tfsyncmodes.errors import ConfigError, run
    from tfsyncmodes.keras import wrap  # registers the wrapper classes of the Keras in use
    from tfsyncmodes.strategies import ModeStrategy, make_strategy
