"""The one place that decides which Keras is in use.

TensorFlow routes ``tf.keras`` to tf_keras (Keras 2) when ``TF_USE_LEGACY_KERAS`` is set, and to
Keras 3 otherwise; tfsyncmodes follows the same switch so that its optimizer and callbacks
belong to the Keras the user's model belongs to.
"""
import os

LEGACY = os.environ.get("TF_USE_LEGACY_KERAS", None) in ("true", "True", "1")

if LEGACY:
    import tf_keras as keras  # noqa: F401
else:
    import keras  # noqa: F401
