"""The emulated cluster bed (benchmarks/bed.py): a 2-host bed with a shaped link trains 2 real
ranks, measures its link near the shaping, is slowed by it as the calibration says, and leaves
no namespace, bridge or process behind; and its bad flags are one line with status 2."""
import json
import os
import subprocess
import time
from types import SimpleNamespace

import pytest

from benchmarks import bed_async, bed_calibration as cal
from tests.conftest import PYTHON, REPO, clean_env
from tests.test_multihost import why_no_bed
from tfsync_testbed import localrun, netns, ssh

# Namespace hosts and their addresses are the machine's: one such test at a time (pytest-xdist).
pytestmark = pytest.mark.xdist_group("namespace-hosts")


def bed_leftovers() -> set:
    """Namespaces and bridges of beds, and anything listening on the beds' subnet."""
    names = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, text=True, timeout=30).stdout.split()
    bridges = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], stdout=subprocess.PIPE, text=True,
                             timeout=30).stdout.split()
    return ({n for n in names if n.startswith(netns.PREFIX)} | {b.rstrip(":") for b in bridges if b.startswith("tfsbr")}
            | {a for a in netns.listening() if a.startswith(netns.SUBNET)})


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_host_bed_shapes_its_link_trains_and_tears_down(tmp_path):
    reason = why_no_bed() or ssh.why_unavailable()
    if reason:
        pytest.skip(reason)
    before = bed_leftovers()
    result = localrun.run([PYTHON, "-m", "benchmarks.bed", "--ranks=2", "--link=1gbit", "--straggler=none",
                           "--modes=sync,async,auto", "--repeats=1", "--epochs=1", f"--docs_dir={tmp_path}",
                           f"--python={PYTHON}",  # the ranks on the warm interpreter
                           "--timeout=150"],  # a run takes about 20 s: a stuck one is reported with its output
                          timeout=800, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    data = json.loads((tmp_path / "bed_2r_1gbit.json").read_text())
    shaped = cal.link_bits_per_second("1gbit") / 1e6  # 13.4 Mbit/s
    assert 0.8 * shaped < data["measured_mbit_s"] < 1.1 * shaped, data
    row, across, chosen = data["rows"]
    assert (row["mode"], across["mode"], chosen["mode"]) == ("sync", "async", "auto")
    assert data["async_on"].startswith("namespaces")
    assert (data["seed"], data["extra_flags"]) == (0, "")  # what the cost model replays the draws with
    # Every step waits 50 ms and allreduces 340 KB over the shaped link (1 * 340,008 B at
    # 13.4 Mbit/s = 203 ms for 2 ranks): the run cannot beat that, whatever the cores do.
    comm = cal.ring_comm_seconds(2, "1gbit")
    assert 0.2 < comm < 0.21
    assert 0 < row["samples_per_s"] < 64 / (cal.EMU_STEP_MS / 1000 + 0.8 * comm), row
    assert row["test_accuracy"] > 0.5, row  # a real model trained on the digits
    # Async across the namespaces: every update pulls the model out of the ps's host, so the ps's
    # shaped link carries at most measured / (B * 8) updates a second of 32 samples (64 / 2).
    model_bits = cal.emulated_parameters() * 4 * 8
    assert 0 < across["samples_per_s"] < 1.1 * 32 * data["measured_mbit_s"] * 1e6 / model_bits, across
    assert across["test_accuracy"] > 0.3, across
    # Auto's profile of its own job: 50 ms of compute against about 200 ms of allreduce over
    # the shaped link, while hybrid's two hosts (one rank each) average every 8 steps: it must
    # predict hybrid at least 1.25x sync's rate and pick it.
    assert chosen["auto_picks"] == ["hybrid"] and chosen["auto_predicted_gains"][0] >= 1.25, chosen
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "Emulated cluster bed: 2 ranks, link 1gbit" in text
    assert "- none: auto picked hybrid (hybrid/sync predicted" in text
    assert bed_leftovers() <= before


@pytest.mark.timeout(180)
def test_a_bed_counts_each_links_drops_and_resends_and_sets_sysctls_per_host():
    reason = why_no_bed()
    if reason:
        pytest.skip(reason)
    from benchmarks.linkrate import link_rate

    sysctl = ["sysctl", "-n", "net.ipv4.tcp_slow_start_after_idle"]
    machine = subprocess.run(sysctl, stdout=subprocess.PIPE, text=True, timeout=30).stdout.strip()
    flipped = "1" if machine == "0" else "0"
    with netns.HostBed(2) as bed:
        # A queue of 5 ms at 2 Mbit/s holds about one packet: a 2 s stream from A to B must
        # overflow it, and TCP must send the lost segments again. B sends only acknowledgements.
        bed.shape("2mbit", burst="16kb", latency="5ms")
        bed.sysctl("net.ipv4.tcp_slow_start_after_idle", flipped)
        inside = [subprocess.run(h.wrap(sysctl), stdout=subprocess.PIPE, text=True, timeout=30).stdout.strip()
                  for h in bed.hosts]
        before = bed.counters()
        rate = link_rate(bed)
        after = bed.counters()
    assert inside == [flipped, flipped]
    assert subprocess.run(sysctl, stdout=subprocess.PIPE, text=True, timeout=30).stdout.strip() == machine
    assert 0 < rate * 8 < 2.2e6, rate
    assert after[0]["dropped"] > before[0]["dropped"], (before, after)
    assert after[0]["retransmitted"] > before[0]["retransmitted"], (before, after)
    assert after[1]["dropped"] == before[1]["dropped"], (before, after)


@pytest.mark.parametrize("module, flag, words", [
    ("bed", "--ranks=3", "flag: --ranks: 3 is not accepted; use 1, 2, 4 or 8"),
    ("bed", ["--ranks=1", "--modes=sync,async"], "flag: --ranks: 1 runs an async worker alone (its own rate), no other mode"),
    ("bed", "--straggler=slowish", "flag: --straggler: 'slowish' is not a condition"),
    ("bed", "--modes=fast", "flag: --modes: 'fast' is not a mode of the bed"),
    ("bed", "--render=nothing.json", "flag: --render: nothing.json is not a bed run's JSON (FileNotFoundError"),
    ("bed", "--pareto_alpha=1", "flag: --pareto_alpha: 1.0 is not accepted"),
    ("bed", "--step_ms=0", "flag: --step_ms: 0.0 is not accepted"),
    ("bed", "--ps=5", "flag: --ps: 5 parameter servers; use 1 to 4"),
    ("bed", ["--ps=2", "--modes=sync"], "flag: --ps: 2 parameter servers but no async run"),
    ("bed", ["--ps_link=100gbit", "--modes=sync"], "flag: --ps_link: 100gbit for the ps hosts but no async run"),
    ("bed", "--first_bytes=100", "flag: --first_bytes: 100 is not accepted; use 0 (one queue) or a power of two"),
    ("bed", "--flow_queues=8", "flag: --flow_queues: 8 is not accepted; use 0 (one queue) or 16"),
    ("bed", ["--flow_queues=16", "--first_bytes=1024"], "flag: --flow_queues: flow queues and --first_bytes are two ways"),
    ("bed", "--extra_flags=--seed=one", "flag: --extra_flags: its --seed is not a whole number"),
    ("bed", "--extra_flags=--seed one", "flag: --extra_flags: its --seed is not a whole number"),
    ("breakeven", "--ranks=3", "flag: --ranks: 3 is not accepted; use 2, 4 or 8"),
    ("breakeven", "--ratios=0.5,2", "flag: --ratios: '2' is not a ratio"),
    ("breakeven", "--ratios=half", "flag: --ratios: 'half' is not a ratio"),
    ("breakeven", "--repeats=0", "flag: --repeats: 0 is too small"),
    ("breakeven", "--step_ms=0.5", "flag: --step_ms: 0.5 is not accepted"),
    ("bench_multihost", "--hybrid_knobs=period", "flag: --hybrid_knobs: 'period' is not KNOB=VALUE"),
    ("bench_multihost", "--hybrid_knobs=mode=sync", "flag: --hybrid_knobs: 'mode=sync' is not KNOB=VALUE"),
])
def test_bad_bed_and_breakeven_flags_are_one_line_with_status_2(module, flag, words):
    flags = flag if isinstance(flag, list) else [flag]
    result = localrun.run([PYTHON, "-m", f"benchmarks.{module}", *flags], timeout=120, env=clean_env(), cwd=REPO)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"benchmarks.{module}: error: ") and words in lines[0], lines


@pytest.mark.parametrize("step_ms", [50.0, 200.0])
def test_a_slower_emulated_step_slows_the_links_and_keeps_the_named_workloads_ratio(step_ms):
    """ResNet-50 v1.5 on a V100 (256 images in 256 / 1270 s, 25,557,032 float32 gradients), ring
    allreduce at N ranks: its communication over its compute, the same on the bed at any step."""
    real_step, real_bytes = 256 / 1270, 25_557_032 * 4
    bed_bytes = (64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10) * 4
    for link, bits in {"100gbit": 100e9, "10gbit": 10e9, "1gbit": 1e9, "100mbit": 100e6}.items():
        shaped = bits * bed_bytes / real_bytes * real_step / (step_ms / 1000)
        assert cal.link_bits_per_second(link, step_ms) == pytest.approx(shaped, rel=1e-12)
        assert cal.tc_rate(link, step_ms) == f"{int(shaped / 1000)}kbit"
        for ranks in (2, 4, 8):
            real_ratio = 2 * (ranks - 1) / ranks * real_bytes * 8 / bits / real_step
            assert cal.ring_comm_seconds(ranks, link, step_ms) / (step_ms / 1000) == pytest.approx(real_ratio)
    # The transient window is a stretch of the run: four times the step, four times the seconds.
    first, end = cal.transient_window_seconds(66, 8, "10gbit", step_ms)
    base_first, base_end = cal.transient_window_seconds(66, 8, "10gbit", 50.0)
    assert (first, end) == pytest.approx((base_first * step_ms / 50, base_end * step_ms / 50), abs=0.01 * step_ms / 50)
    flag = cal.straggler_flags("transient", 66, 2.0, 8, "10gbit", step_ms)
    assert flag == [f"--compute_slow_worker=1:4:{first:g}s:{end:g}s"]


def test_a_bed_run_at_another_step_says_so_in_its_command(tmp_path):
    from benchmarks.bed_report import section

    data = json.loads(open(os.path.join(REPO, "docs", "bed_4r_100mbit_slices.json"), encoding="utf-8").read())
    assert "--step_ms" not in section(data, "bed_4r_100mbit_slices")
    text = section({**data, "emulated_step_ms": 200.0}, "bed_8r")
    assert "--compute=emulated --step_ms=200`" in text and "calibration (benchmarks/bed_calibration.py) at 200 ms a step," in text


def test_render_writes_a_runs_section_again_from_its_json(tmp_path):
    source = os.path.join(REPO, "docs", "bed_4r_100mbit_slices.json")
    data = json.loads(open(source, encoding="utf-8").read())
    result = localrun.run([PYTHON, "-m", "benchmarks.bed", f"--render={source}", f"--docs_dir={tmp_path}"],
                          timeout=120, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "<!-- bench:bed_4r_100mbit_slices:begin -->" in text and "--link=100mbit" in text
    for row in data["rows"]:  # every row, its steady runs rounded as the table prints them
        steady = ", ".join(f"{v:.0f}" for v in row["steady_samples_per_s_runs"])
        line = next(l for l in text.splitlines() if l.startswith(f"| {row['straggler']} | {row['mode']} |"))
        assert f"({steady})" in line and f"{row['test_accuracy']:.3f}" in line, line


def test_a_rendered_section_names_the_flags_its_run_was_taken_with():
    from benchmarks.bed_report import section

    data = json.loads(open(os.path.join(REPO, "docs", "bed_4r_10gbit_current.json"), encoding="utf-8").read())
    assert "--queue_ms" not in section(data, "x") and "--extra_flags" not in section(data, "x")
    data.update(queue_ms=10.0, tcp_slow_start_after_idle=False, extra_flags="--sync_switch_patience=1")
    command = section(data, "x").split("`")[1]
    assert command.endswith(" --queue_ms=10 --notcp_slow_start_after_idle --extra_flags='--sync_switch_patience=1'")
    assert "--ps_link" not in command
    data.update(ps_link="100gbit", batch_size=16, first_bytes=128)
    assert " --batch_size=16 --ps_link=100gbit --queue_ms=10 --first_bytes=128 " in section(data, "x").split("`")[1]
    data.update(first_bytes=0, flow_queues=16)
    assert " --queue_ms=10 --flow_queues=16 " in section(data, "x").split("`")[1]


def test_a_bed_shapes_only_the_hosts_it_is_given():
    reason = why_no_bed()
    if reason:
        pytest.skip(reason)
    show = ["tc", "qdisc", "show", "dev", netns.IFACE]
    with netns.HostBed(3) as bed:
        bed.shape("10mbit", burst="32kb", latency="20ms")
        bed.shape("2mbit", burst="16kb", latency="5ms", hosts=bed.hosts[1:2])
        qdiscs = [subprocess.run(h.wrap(show), stdout=subprocess.PIPE, text=True, timeout=30).stdout for h in bed.hosts]
        bed.shape(None, hosts=bed.hosts[:1])
        unshaped = subprocess.run(bed.hosts[0].wrap(show), stdout=subprocess.PIPE, text=True, timeout=30).stdout
    assert ["rate 10Mbit" in q for q in qdiscs] == [True, False, True], qdiscs
    assert "rate 2Mbit" in qdiscs[1], qdiscs
    assert "tbf" not in unshaped, unshaped


def test_the_bed_reads_the_cores_busy_from_proc_stat(tmp_path):
    from benchmarks import bed_probe

    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 5 20 700 30 1 2 3 50 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert bed_probe.cpu_times(str(stat)) == (100 + 5 + 20 + 1 + 2 + 3, 861)

    class Bed:  # no hosts: the machine's cores only
        def counters(self):
            return [{"dropped": 0}]

    probe, end = bed_probe.Probe(Bed(), cores=os.cpu_count()), time.monotonic() + 0.5
    while time.monotonic() < end:  # this process keeps one core busy
        pass
    busy = probe.read()["cores_busy"]
    assert 0.8 <= busy <= os.cpu_count() + 0.01, busy


def test_the_best_mode_under_horovodrun_is_hybrid_when_its_median_ratio_to_sync_is_below_1():
    from benchmarks.bed_report import auto_lines, best_under_horovodrun

    def row(mode, ratios, **extra):
        return {"straggler": "none", "mode": mode, "ratio_to_sync_runs": {"0.75": ratios}, **extra}

    assert best_under_horovodrun([row("sync", []), row("hybrid", [0.8, 1.4, 0.9])], "none") == "hybrid"
    assert best_under_horovodrun([row("hybrid", [1.2, None, 0.9, 1.1])], "none") == "sync"  # median of 3: 1.1
    assert best_under_horovodrun([row("sync", [])], "none") is None
    rows = [row("hybrid", [0.5, 0.6, 0.7]), row("auto", [0.6, 0.6, 0.6], auto_picks=["hybrid", "sync", "hybrid"],
                                                 auto_predicted_gains=[1.5, 1.2, 1.31])]
    assert auto_lines(rows, ["none", "heavy"])[-1] == (
        "- none: auto picked hybrid, sync, hybrid (hybrid/sync predicted 1.50, 1.20, 1.31); "
        "measured best of sync and hybrid: hybrid")


def test_whole_run_and_accuracy_ratios_pair_each_run_with_its_repeats_sync_run_from_the_first_step():
    from benchmarks.bed_report import accuracy_ratios, section, whole_run_ratios

    def run(repeat, seconds, accuracies, final, first=1.0):
        return {"repeat": repeat, "train_seconds": seconds[-1] + 0.5, "first_step_seconds": first,
                "epoch_seconds": seconds, "epoch_accuracy": accuracies, "test_accuracy": final}

    sync = [run(0, [3.0, 5.0, 9.0], [0.90, 0.96, 0.95], 0.96), run(1, [3.0, 6.0, 11.0], [0.9, 0.93, 0.97], 0.97)]
    policy = [run(1, [2.0, 4.0, 6.0], [0.9, 0.97, 0.99], 0.99, first=2.0), run(0, [4.0, 5.0, 7.0], [0.9, 0.9, 0.91], 0.91)]
    # to the last epoch's end (train_seconds, 0.5 s later, counts the teardown too):
    # repeat 1: (6 - 2) / (11 - 1); repeat 0: (7 - 1) / (9 - 1)
    assert whole_run_ratios(policy, sync) == [round(4.0 / 10.0, 3), round(6.0 / 8.0, 3)]
    assert whole_run_ratios([{"repeat": 0, "train_seconds": 5.0}], [{"repeat": 0, "train_seconds": 9.0}]) == [
        round(5.0 / 9.0, 3)]  # no epoch ends recorded: the whole fit
    # repeat 1: sync's 0.97 first at 11 s, the policy's at 4 s; repeat 0: never reaches sync's 0.96
    # (sync's own first 0.96 is at 5 s, before its last epoch's 0.95)
    assert accuracy_ratios(policy, sync) == [round((4.0 - 2.0) / (11.0 - 1.0), 3), None]
    assert accuracy_ratios(policy, []) == [None, None]
    rows = [{"straggler": "heavy", "mode": "policy", "seconds_to_sync_loss_drop": {}, "ratio_to_sync_runs": {},
             "test_accuracy_runs": [0.99], "test_accuracy": 0.99, "samples_per_s": 1.0, "steady_samples_per_s": 1.0,
             "steady_samples_per_s_runs": [1.0], "whole_run_ratio_runs": [0.43, 0.76],
             "sync_accuracy_ratio_runs": [0.2, None]}]
    text = section({"rows": rows, "ranks": 4, "link": "10gbit", "epochs": 3, "repeats": 2, "compute": "emulated",
                    "hosts": [2, 2], "shaped": "x", "measured_mbit_s": 1.0, "async_on": "x"}, "bed_x")
    assert "| heavy | policy | 0.43, 0.76 | 0.20, - |" in text


def test_the_switch_table_names_each_switchs_epoch_and_direction_and_its_seconds():
    from benchmarks.bed_report import switch_lines

    runs = [{"straggler": "heavy", "mode": "policy", "repeat": 0, "modes": [0.0, 2.0, 2.0],
             "mode_switches": [0.0, 1.0, 0.0], "switch_seconds": [0.0, 1.5, 0.0]},
            # epoch 2 ends in hybrid after two switches (to hybrid, back, to hybrid); epoch 3 back to sync
            {"straggler": "transient", "mode": "policy", "repeat": 2, "modes": [0.0, 2.0, 0.0],
             "mode_switches": [0.0, 3.0, 1.0], "switch_seconds": [0.0, 2.25, 0.5]},
            {"straggler": "none", "mode": "policy", "repeat": 1, "modes": [0.0, 0.0],
             "mode_switches": [0.0, 0.0], "switch_seconds": [0.0, 0.0]},
            # the policy goes back to sync at epoch 2's end (the epoch logs hybrid, the mode it
            # trained in; the switch is timed in epoch 3), and again at the last epoch's end
            {"straggler": "heavy", "mode": "policy", "repeat": 2, "modes": [2.0, 2.0, 2.0, 2.0],
             "mode_switches": [1.0, 1.0, 1.0, 1.0], "switch_seconds": [1.75, 0.0, 2.5, 0.0]},
            {"straggler": "none", "mode": "hybrid", "repeat": 0}]  # not a switching run: no line
    lines = switch_lines(runs)
    assert lines[-4:] == ["| heavy | policy | 1 | 2 to hybrid | 1.50 |",
                          "| transient | policy | 3 | 2 to hybrid; 2 to sync; 2 to hybrid; 3 to sync | 2.25, 0.50 |",
                          "| none | policy | 2 | none | not recorded |",
                          "| heavy | policy | 3 | 1 to hybrid; 2 to sync; 3 to hybrid; 4 to sync | "
                          "1.75, 2.50; the last: no step after it |"]
    assert switch_lines(runs[4:]) == []


def test_async_puts_the_chief_and_the_ps_on_hosts_of_their_own_and_the_workers_over_the_others():
    """The placement of a bed of 4 ranks: 2 rank hosts, then one host per ps."""
    hosts = [SimpleNamespace(address=f"10.9.0.{i + 1}") for i in range(4)]
    one = bed_async.cluster(hosts[:3], ranks=4, rank_hosts=2)
    assert one["chief"] == ["10.9.0.3:2222"] and one["ps"] == ["10.9.0.3:2223"]
    assert one["worker"] == ["10.9.0.1:2222", "10.9.0.2:2222", "10.9.0.1:2223", "10.9.0.2:2223"]
    two = bed_async.cluster(hosts, ranks=4, rank_hosts=2, ps=2)
    assert two["chief"] == ["10.9.0.3:2222"] and two["ps"] == ["10.9.0.3:2223", "10.9.0.4:2223"]
    assert two["worker"] == one["worker"]
    for spec in (one, two):
        every = spec["chief"] + spec["ps"] + spec["worker"]
        assert len(set(every)) == len(every)
    with pytest.raises(ValueError, match="3 hosts hold 2 rank hosts and 2 ps hosts only if there are 4"):
        bed_async.cluster(hosts[:3], ranks=4, rank_hosts=2, ps=2)
    # More than one ps splits every variable over them, under tf_keras (Keras 3 cannot update the parts).
    assert bed_async.flags_for(1) == [] and bed_async.flags_for(2) == ["--sync_ps_shards=2", "--sync_min_shard_bytes=4096"]
    assert bed_async.env_for({"A": "1"}, 1) == {"A": "1"}
    assert bed_async.env_for({"A": "1"}, 2) == {"A": "1", "TF_USE_LEGACY_KERAS": "1"}


ECHO_UNDER_LOAD = r"""
import socket, statistics, sys, threading, time
if sys.argv[1] == "serve":
    s = socket.create_server((sys.argv[2], 5202)); print("up", flush=True)
    bulk, _ = s.accept(); echo, _ = s.accept()
    echo.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=lambda: [None for _ in iter(lambda: bulk.recv(1 << 20), b"")], daemon=True).start()
    while True:
        data = echo.recv(8)
        if not data: break
        echo.sendall(data)
else:
    ports = [int(p) for p in sys.argv[3:5]] or [0, 0]  # the client ports (0: the kernel's)
    bulk, echo = (socket.create_connection((sys.argv[2], 5202), source_address=("", p)) for p in ports)
    # A bounded send buffer keeps some 50 kB of the bulk queued on the link, under the queue's
    # limit: no drop, so no retransmission timeout empties the queue while the echo is timed.
    bulk.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 15)
    echo.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # The bulk stream runs until the last echo is back, however long a loaded machine takes.
    chunk, done = b"x" * (1 << 16), threading.Event()
    sender = threading.Thread(target=lambda: [bulk.sendall(chunk) for _ in iter(done.is_set, True)], daemon=True)
    sender.start()
    time.sleep(1.5)  # the bulk stream has filled the queue
    rtts = []
    for _ in range(10):
        t0 = time.perf_counter(); echo.sendall(b"q" * 8); got = b""
        while len(got) < 8: got += echo.recv(8 - len(got))
        rtts.append(time.perf_counter() - t0); time.sleep(0.05)
    print(statistics.median(rtts), flush=True)
    done.set(); sender.join(30); bulk.close(); echo.close()
"""


def echo_under_load(bed, *ports: str) -> float:
    """The median round trip of an 8-byte echo from host A to B while a bulk stream from A keeps
    data queued on A's link (`ports`: the two connections' client ports; none: the kernel's)."""
    a, b = bed.hosts
    server = b.popen([PYTHON, "-c", ECHO_UNDER_LOAD, "serve", b.address], stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        client = a.run([PYTHON, "-c", ECHO_UNDER_LOAD, "send", b.address, *ports], timeout=60)
    finally:
        server.kill()
        server.wait()
    assert client.returncode == 0, client.stderr[-2000:]
    return float(client.stdout.strip())


def test_first_bytes_sends_a_small_packet_ahead_of_the_bulk_data_queued_on_a_link():
    reason = why_no_bed()
    if reason:
        pytest.skip(reason)
    rtts = {}
    with netns.HostBed(2) as bed:
        for first_bytes in (0, 128, 0):
            # 4 Mbit/s and a queue of up to 200 ms: a bulk stream keeps data queued on A's link.
            bed.shape("4mbit", burst="16kb", latency="200ms", first_bytes=first_bytes)
            rtts.setdefault(first_bytes, []).append(echo_under_load(bed))
    # The request's packet (60 bytes) waits behind the queued bulk data in one queue, and
    # passes it in the queue of its own.
    # (Relative, not a fixed time: a loaded machine adds its wake-ups to both.)
    assert rtts[128][0] * 4 < min(rtts[0]) and min(rtts[0]) > 0.01, rtts


def test_flow_queues_keep_a_connection_apart_from_another_ones_queued_bulk_data():
    reason = why_no_bed()
    if reason:
        pytest.skip(reason)
    from benchmarks.linkrate import link_rate

    rtts = {}
    with netns.HostBed(2) as bed:
        # The bulk stream and the echo both connect to B's port 5202 (low nibble 2), from client
        # ports whose low nibbles differ (0 and 5: classes 2 and 7) or agree (0 and 0: one class);
        # fresh ports every run (a closed connection's port waits a while).
        runs = ((0, ("40000", "40005")), (16, ("40032", "40037")), (16, ("40064", "40080")))
        for flows, ports in runs:
            bed.shape("4mbit", burst="16kb", latency="200ms", flows=flows)
            rtts[flows, ports[1]] = echo_under_load(bed, *ports)
        rate = link_rate(bed) * 8  # one connection alone still has the whole link
    one_queue, apart, together = rtts[0, "40005"], rtts[16, "40037"], rtts[16, "40080"]
    # The echo waits behind the bulk data in one queue, and in a class the bulk stream shares;
    # in a class of its own it is served at its turn, ahead of the bulk's queued data.
    assert apart * 4 < min(one_queue, together) and min(one_queue, together) > 0.01, rtts
    assert 2e6 < rate < 4.4e6, rate  # a class alone is guaranteed 0.25 Mbit/s and borrows the rest


def test_a_capture_without_tcpdump_is_one_line_with_status_2():
    # tcpdump looked for on PATH: one that holds the interpreter's directory only.
    env = clean_env(PATH=os.path.dirname(PYTHON))
    result = localrun.run([PYTHON, "-m", "benchmarks.bed", "--capture_dir=unused"], timeout=120, env=env, cwd=REPO)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines == ["benchmarks.bed: error: flag: --capture_dir: needs tcpdump, which is not installed; "
                     "apt-get install tcpdump, or leave it out"]
