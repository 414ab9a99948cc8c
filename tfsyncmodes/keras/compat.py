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


def build_optimizer(model) -> None:
    """Builds the model's optimizer over its trainable variables if it is not built yet, so
    that its slots and exchange state exist (Keras 3 says so in ``built``, tf_keras in
    ``_built``)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not hasattr(optimizer, "build"):
        return
    built = getattr(optimizer, "built", None)
    if built is None:
        built = getattr(optimizer, "_built", False)
    if not built:
        optimizer.build(model.trainable_variables)


def build_metrics(model, dataset) -> None:
    """Makes the compiled metrics' variables before the first step, from `dataset`'s element
    spec (Keras 3, symbolically, as its ``fit`` does under a tf.distribute strategy and not
    under Horovod) or one of its batches (tf_keras). Made inside the first step's trace
    instead, they make ``tf.function`` trace the step a second time, a step's worth of
    tracing added to the first step of every fit."""
    if LEGACY:
        metrics = getattr(model, "compiled_metrics", None)
        if metrics is None or getattr(metrics, "_built", True):
            return
        x, y, _ = keras.utils.unpack_x_y_sample_weight(next(iter(dataset)))
        metrics.build(model(x, training=False), y)
        return
    metrics = getattr(model, "_compile_metrics", None)
    if metrics is not None and not metrics.built and hasattr(model, "_symbolic_build"):
        model._symbolic_build(data_batch=dataset.element_spec)
