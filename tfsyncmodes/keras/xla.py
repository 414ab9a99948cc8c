"""``jit_compile`` made safe on the Horovod path.

Horovod's collectives have no XLA kernels, so a train step compiled with XLA that contains
them fails to compile. Keras 3's ``compile(jit_compile="auto")`` turns XLA on by itself on a
GPU host when no ``tf.distribute`` strategy is in use (which is the case under Horovod), so a
user who forgets ``jit_compile=False`` would meet that failure on a GPU and never on a CPU.
:class:`XlaOffForCollectives` turns XLA off for such a model before its first step, rebuilds the
train function, and says so in one line; the rest of the step still runs as a ``tf.function``.
"""
from __future__ import annotations

from absl import logging

from tfsyncmodes.keras.compat import keras


class XlaOffForCollectives(keras.callbacks.Callback):
    """Before training: a model compiled with XLA on gets it off (Horovod ops inside)."""

    def __init__(self):
        super().__init__()
        self.turned_off = False

    def on_train_begin(self, logs=None):
        model = self.model
        if not getattr(model, "jit_compile", False):
            return
        model.jit_compile = False
        if hasattr(model, "make_train_function"):
            model.train_function = None
            model.make_train_function(force=True)
        self.turned_off = True
        logging.warning("tfsyncmodes: jit_compile turned off: Horovod's collectives have no XLA "
                        "kernels (compile with jit_compile=False to silence this)")
