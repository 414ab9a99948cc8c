"""The async runner's staleness tally (tfsyncmodes/keras/tally.py) against NumPy: the updates, mean
and maximum between two reads, the last bucket a floor, and concurrent updates none of them lost.
The tally in a real gRPC cluster: tests/test_async.py and tests/test_async_exact.py."""
import threading

import numpy as np
import pytest
import tensorflow as tf

from tfsyncmodes.keras.tally import Staleness, StalenessTally


def reference(values, buckets):
    """The tally's figures for `values`, from NumPy: the maximum read from the buckets."""
    values = np.maximum(np.asarray(values, np.int64), 0)
    if values.size == 0:
        return Staleness(0, 0.0, 0)
    return Staleness(int(values.size), float(values.sum()) / values.size, int(min(values.max(), buckets - 1)))


def recorder(tally):
    """The tally's record as a tf.function of its own (a step's writes are traced)."""
    @tf.function
    def record(value):
        tally.record(value)
    return record


def test_each_read_gives_the_updates_since_the_last_their_mean_and_maximum():
    rng = np.random.default_rng(3)
    tally = StalenessTally(buckets=16)
    record = recorder(tally)
    for values in (rng.integers(0, 12, 40), [5], [], rng.integers(0, 40, 25), [0, 0, 0]):
        for value in values:
            record(tf.constant(int(value), tf.int64))
        got, want = tally.read(), reference(values, 16)
        assert (got.updates, got.max) == (want.updates, want.max)
        assert got.mean == pytest.approx(want.mean, rel=1e-12)
    # A staleness at or past the last bucket counts there: the maximum reads as a floor (15),
    # the mean keeps the values themselves.
    for value in (3, 200, 15):
        record(tf.constant(value, tf.int64))
    assert tally.read() == Staleness(3, (3 + 200 + 15) / 3, 15)


def test_updates_made_at_once_from_several_threads_are_all_tallied():
    tally = StalenessTally(buckets=8)
    record = recorder(tally)
    values = [np.arange(400) % 11 + worker for worker in range(4)]

    def work(mine):
        for value in mine:
            record(tf.constant(int(value), tf.int64))

    threads = [threading.Thread(target=work, args=(mine,)) for mine in values]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    got, want = tally.read(), reference(np.concatenate(values), 8)
    assert got.updates == want.updates == 1600, got
    assert got.mean == pytest.approx(want.mean, rel=1e-12) and got.max == want.max == 7


def test_a_tally_needs_two_buckets():
    with pytest.raises(ValueError, match="2 buckets or more, got 1"):
        StalenessTally(buckets=1)
