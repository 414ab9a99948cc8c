"""``python -m benchmarks.bytes_target``: each repeat's bytes ratio and accuracy gap from the two
runs' metrics, the targets judged (1/400 of sync's bytes in every repeat, the median accuracy
within 1 point of sync's), and
bad flags refused in one line with status 2 before any job starts."""
import pytest

from benchmarks import bytes_target
from tests.conftest import check_bad_benchmark_flag

PARAMS = 1_126_410


def metrics(accuracy, bytes_sent=None):
    out = {"params": PARAMS, "test_accuracy": accuracy, "train_seconds": 12.5}
    if bytes_sent is not None:
        out["bytes_sent"] = bytes_sent
    return out


def test_a_repeat_is_bytes_per_step_against_float32_gradients_and_the_accuracy_gap():
    # Epoch means of 9,000 and 11,000 bytes: 10,000 a step against 4 bytes a parameter.
    row = bytes_target.pair(2, metrics(0.99), metrics(0.985, [9000.0, 11000.0]))
    assert row["sync_bytes_per_step"] == 4 * PARAMS
    assert row["hybrid_bytes_per_step"] == 10000.0
    assert row["bytes_ratio"] == pytest.approx(10000.0 / 4505640)
    assert row["points_behind"] == pytest.approx(0.005)


@pytest.mark.parametrize("ratios,accuracies,bytes_met,accuracy_met,every", [
    # both limits inclusive; medians 0.98 and 0.97
    ([1 / 500, 1 / 450, 1 / 400], [(0.98, 0.97), (0.99, 0.97), (0.97, 0.99)], True, True, False),
    ([1 / 500, 1 / 399, 1 / 500], [(0.98, 0.98)] * 3, False, True, True),  # one repeat over 1/400
    # medians 0.98 and 0.9694: 1.06 points behind, every repeat 0.0106 behind at most
    ([1 / 500] * 3, [(0.98, 0.9694), (0.97, 0.969), (0.99, 0.9794)], True, False, False),
])
def test_bytes_hold_in_every_repeat_and_accuracy_by_the_median(ratios, accuracies, bytes_met, accuracy_met, every):
    pairs = [{"bytes_ratio": r, "sync_accuracy": s, "hybrid_accuracy": h, "points_behind": s - h}
             for r, (s, h) in zip(ratios, accuracies)]
    verdict = bytes_target.verdict(pairs)
    assert (verdict["bytes_met"], verdict["accuracy_met"], verdict["accuracy_met_every_repeat"]) == (
        bytes_met, accuracy_met, every)
    assert verdict["bytes_ratio_range"] == [min(ratios), max(ratios)]
    sync, hybrid = (sorted(a[i] for a in accuracies)[1] for i in (0, 1))  # the middle of three
    assert verdict["median_points_behind"] == pytest.approx(sync - hybrid)


def test_the_section_shows_each_repeat_as_a_fraction_and_points():
    pairs = [bytes_target.pair(0, metrics(0.9917), metrics(0.9889, [4505640 / 552] * 3))]
    text = bytes_target.section({"ranks": 4, "repeats": 1, "epochs": 10, "params": PARAMS, "hybrid_flags": "x",
                                 "pairs": pairs, "verdict": bytes_target.verdict(pairs)})
    row = next(line for line in text.splitlines() if line.startswith("| 0 |"))
    assert [c.strip() for c in row.strip("|").split("|")] == [
        "0", "4,505,640", "8,162", "1/552", "0.9917", "0.9889", "+0.28"]
    assert "target 1/400: met" in text and "within 1 point: met" in text
    assert "0.9889 against sync's 0.9917, +0.28 points" in text


@pytest.mark.parametrize("flag,words", [("--repeats=0", "--repeats: 0 is too small"),
                                        ("--ranks=1", "--ranks: 1 is too small"),
                                        ("--hybrid_flags=--sync_mode=sync", "--hybrid_flags: sets --sync_mode")])
def test_a_bad_flag_is_one_line_and_status_2(tmp_path, flag, words):
    check_bad_benchmark_flag("bytes_target", flag, words, tmp_path)
