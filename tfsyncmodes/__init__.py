"""tfsyncmodes: switch TensorFlow/Keras data-parallel training between sync, async and hybrid
replica synchronisation with one flag.

    strategy = tfsyncmodes.make_strategy()          # --sync_mode / TFSYNC_MODE / config file
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=tfsyncmodes.wrap(keras.optimizers.Adam(1e-3)), ...)
    strategy.fit(model, dataset_fn, epochs=5, steps_per_epoch=100)
"""
from tfsyncmodes import _requirements  # noqa: F401  (a clear error when TensorFlow is missing)
from tfsyncmodes import flags as _flags  # noqa: F401  (defines --sync_mode and the other knobs)
from tfsyncmodes.config import SyncConfig, resolve
from tfsyncmodes.errors import ConfigError, run
from tfsyncmodes.keras import wrap  # registers the wrapper classes of the Keras in use
from tfsyncmodes.strategies import ModeStrategy, make_strategy

__version__ = "0.1.0"
__all__ = ["ConfigError", "ModeStrategy", "SyncConfig", "make_strategy", "resolve", "run", "wrap"]
