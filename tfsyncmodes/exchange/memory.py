"""Error-feedback memory: what compression dropped this step is added back next step.

Without it, Top-K would never send the many small entries of a gradient, and they would be
lost for good; with it, they accumulate until they are large enough to be sent (Stich et al.,
"Sparsified SGD with memory"; Lin et al., "Deep Gradient Compression").
"""
from __future__ import annotations

import tensorflow as tf

from tfsyncmodes.exchange.compressors import Compressor, Payload


class NoMemory:
    """Nothing is remembered: dropped entries are lost."""

    def build(self, size: int) -> None:
        del size

    def compensate(self, flat: tf.Tensor) -> tf.Tensor:
        return flat

    def update(self, compensated: tf.Tensor, payload: Payload, compressor: Compressor):
        """Remembers what `payload` (`compressor`'s output for `compensated`) left out."""
        del compensated, payload, compressor
        return tf.no_op()


class ResidualMemory(NoMemory):
    """Keeps the residual ``compensated - sent`` and adds it to the next update.

    For Top-K the residual is the compensated update with the sent entries zeroed, exactly:
    the sent values are copies of those entries, so their difference is 0, and every other
    entry is kept as it was. (Zeroing just those entries in place with a scatter measured
    slower on CPU than this one dense subtraction.)
    """

    def __init__(self):
        self.residual = None

    def build(self, size):
        with tf.init_scope():
            self.residual = tf.Variable(tf.zeros([size], tf.float32), trainable=False,
                                        name="error_feedback_residual")

    def compensate(self, flat):
        return flat + self.residual

    def update(self, compensated, payload, compressor):
        sent = compressor.decompress(payload, int(compensated.shape[0]))
        return self.residual.assign(compensated - sent, read_value=False)


def for_config(config):
    """Error feedback when the compression drops information and it is turned on."""
    if config.error_feedback and config.compression != "none":
        return ResidualMemory()
    return NoMemory()
