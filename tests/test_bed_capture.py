"""benchmarks.bed_capture's reading of a capture: an async worker's steps split at the chief's
dispatches and the worker's push, and the waits below TCP, on packets made here with known
timings (the capture itself needs tcpdump and the bed: a diagnostic, not run in CI)."""
import pytest

from benchmarks import bed_capture

ME, WORKER = "10.0.0.3", "10.0.0.1"  # the chief's and ps's host; a worker's host


def step_packets(start, compute=0.050, push=0.020, after=0.015):
    """One step as the chief's host sees it: the chief's dispatch (2,399 B to the worker's server
    at port 2223), the worker's push (340 KB in 1,448-byte packets over `push` seconds, on the
    ps's connection to that server), then small calls until the next dispatch `after` later."""
    rows = [(start, ME, 41000, WORKER, 2223, 2399, None)]
    first = start + compute
    n = 340000 // 1448
    rows += [(first + push * i / (n - 1), WORKER, 2223, ME, 42000, 1448, None) for i in range(n)]
    rows += [(first + push + after / 2, ME, 41000, WORKER, 2223, 81, None)]
    return rows, first + push + after


def test_steps_split_at_the_dispatch_and_the_push():
    rows, t = [], 0.0
    for _ in range(5):
        step, t = step_packets(t)
        rows += step
    report = bed_capture.worker_steps(sorted(rows), ME)
    parts = report[f"{WORKER}:2223"]
    assert parts["steps"] == 4  # between five dispatches
    assert parts["step"] == pytest.approx(85.0, abs=0.01)
    assert parts["dispatch to push"] == pytest.approx(50.0, abs=0.01)
    assert parts["push"] == pytest.approx(20.0, abs=0.01)
    assert parts["push to next dispatch"] == pytest.approx(15.0, abs=0.01)


def test_transfers_are_split_at_a_gap_and_small_ones_left_out():
    packets = [(i * 0.001, 1448) for i in range(100)]  # 145 KB in 0.1 s
    packets += [(0.2 + i * 0.001, 1448) for i in range(10)]  # 14 KB: not a transfer of the model
    packets += [(0.5 + i * 0.001, 1448) for i in range(100)]
    assert [(round(a, 3), round(b, 3), n) for a, b, n in bed_capture.transfers(packets)] == [
        (0.0, 0.099, 144800), (0.5, 0.599, 144800)]


def test_waits_below_tcp_are_each_connections_capture_against_its_timestamp():
    # TSval in ms; the capture after the queue: 0, 10 and 4 ms late on one connection, bulk
    # and an ack on another.
    rows = [(1.000, ME, 1, WORKER, 2, 0, 5000), (1.020, ME, 1, WORKER, 2, 0, 5010),
            (1.034, ME, 1, WORKER, 2, 0, 5030), (2.000, ME, 3, WORKER, 4, 1448, 900),
            (2.030, ME, 3, WORKER, 4, 1448, 920), (2.040, ME, 3, WORKER, 4, 0, 940),
            (3.000, WORKER, 2, ME, 1, 0, 1)]  # received: not this host's wait
    waits = bed_capture.queue_waits(rows, ME)
    assert waits["ack"][0] == pytest.approx(2.0, abs=1e-6)  # the median of 0, 10, 4 and the other's 0
    assert waits["ack"][2] == pytest.approx(10.0, abs=1e-6)
    assert waits["bulk"][1] == pytest.approx(5.0, abs=1e-6)  # 0 and 10
