"""A backup whose save stops between the weights and the epoch's record (where a killed
process can stop), then a resume from it, under Keras 3 in one process. Writes what the test
compares: each epoch's weights and step count as the first run held them, what the resumed run
started from, and the backup folder's files."""
import json
import os
import sys

EPOCHS, STEPS, STOPPED_AT = 5, 4, 3  # the save of epoch 3 stops before its record


class Stopped(Exception):
    pass


def main(outdir):
    import numpy as np

    from tfsyncmodes.keras.compat import keras
    from tfsyncmodes.keras.resume import ResumeFromBackup

    class StopsBeforeTheRecord(ResumeFromBackup):
        def _commit(self, record):
            if record["epoch"] == STOPPED_AT:
                raise Stopped(record)
            super()._commit(record)

    x = np.random.default_rng(0).standard_normal((8 * STEPS, 4)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")

    def model(seed):
        keras.utils.set_random_seed(seed)
        built = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
        built.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return built

    def state(m):
        return [np.array(v) for v in m.get_weights()], int(m.optimizer.iterations.numpy())

    backup = os.path.join(outdir, "backup")
    first, held = model(1), {}
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: held.update({epoch + 1: state(first)}))
    try:
        first.fit(x, y, batch_size=8, epochs=EPOCHS, shuffle=False, verbose=0,
                  callbacks=[record, StopsBeforeTheRecord(backup)])
        raise AssertionError("the save of epoch 3 did not stop")
    except Stopped:
        pass
    files_after_stop = sorted(os.listdir(backup))

    resumed, seen = model(2), {"epochs": []}
    starts = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: seen.update(begin=state(resumed)),
        on_epoch_begin=lambda epoch, logs: seen["epochs"].append(epoch))
    resumed.fit(x, y, batch_size=8, epochs=EPOCHS, shuffle=False, verbose=0,
                callbacks=[ResumeFromBackup(backup), starts])

    arrays = {f"held{epoch}_{i}": w for epoch, (weights, _) in held.items() for i, w in enumerate(weights)}
    arrays.update({f"begin_{i}": w for i, w in enumerate(seen["begin"][0])})
    np.savez(os.path.join(outdir, "weights.npz"), **arrays)
    with open(os.path.join(outdir, "backup_commit.json"), "w", encoding="utf-8") as handle:
        json.dump({"held_steps": {epoch: steps for epoch, (_, steps) in held.items()},
                   "begin_steps": seen["begin"][1], "epochs_run": seen["epochs"],
                   "files_after_stop": files_after_stop, "files_after_resume": sorted(os.listdir(backup)),
                   "steps_per_epoch": STEPS, "stopped_at": STOPPED_AT, "epochs": EPOCHS}, handle)


if __name__ == "__main__":
    main(sys.argv[1])
