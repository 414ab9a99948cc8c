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
    (a script, ``-c``, standard input)."""
    options = iter(argv[1:])
    for option in options:
        if option in ("-X", "-W"):  # an option with a value of its own
            next(options, None)
        elif option == "-m":
            return next(options, "")
        elif option.startswith("-m"):
            return option[2:]
        elif option == "-c" or not option.startswith("-") or option == "-":
            return ""
    return ""


def __getattr__(name):
    """The public names, imported on first use in a tool's process (PEP 562)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tfsyncmodes' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


if _module_run(getattr(_sys, "orig_argv", ())) not in _WITHOUT_TENSORFLOW:
    from tfsyncmodes import _requirements  # noqa: F401  (a clear error when TensorFlow is missing)
    from tfsyncmodes import flags as _flags  # noqa: F401  (defines --sync_mode and the other knobs)
    from tfsyncmodes.config import SyncConfig, resolve
    from tfsyncmodes.errors import ConfigError, run
    from tfsyncmodes.keras import wrap  # registers the wrapper classes of the Keras in use
    from tfsyncmodes.strategies import ModeStrategy, make_strategy
