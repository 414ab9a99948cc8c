"""Reading what Keras' TensorBoard callback wrote, the way TensorBoard reads it."""
import glob
import os


def scalars(logdir):
    """{tag: [values in step order]} of every scalar in the event files under `logdir`."""
    import tensorflow as tf

    found = {}
    for path in sorted(glob.glob(os.path.join(str(logdir), "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = value.simple_value
                elif value.metadata.plugin_data.plugin_name == "scalars":
                    number = float(tf.make_ndarray(value.tensor))
                else:
                    continue
                found.setdefault(value.tag, []).append((event.step, number))
    return {tag: [v for _, v in sorted(points)] for tag, points in found.items()}
