"""The emulated cluster bed's calibration: a named real workload's compute : communication ratio,
carried over to the small real model the bed trains, and the straggler conditions.

Named workload: ResNet-50 (v1.5) data-parallel on V100 GPUs, one GPU per host, ring allreduce.
  - parameters 25.557M -> gradients 25.557e6 * 4 B = 102.2 MB of float32 per step;
  - compute: 1,270 images/s on one V100-SXM2-16GB (TensorFlow, mixed precision, batch 256), the
    figure of NVIDIA's DeepLearningExamples ResNet-50 v1.5 TensorFlow README, as its users quote
    it (github.com/NVIDIA/DeepLearningExamples/issues/837: "benchmark 1270 img/s (1gpu)")
    -> T_real = 256 / 1270 = 201.6 ms per step;
  - communication: a ring allreduce sends 2(N-1)/N * 102.2 MB through every host's NIC; on
    10 Gbit/s, N = 4: 1.5 * 102.2e6 * 8 / 10e9 = 122.7 ms, i.e. 0.61 * T_real (6.1 on 1 Gbit/s,
    61 on 100 Mbit/s).

The bed: the example trainer's MLP (64 -> 256 -> 256 -> 10, 85,002 parameters: 340,008 B of
gradients, S_emu) on the digits, every rank's step waiting T_emu = 50 ms (a sleep: the workload
runs k = T_real / T_emu = 4.03 times faster than real). The ratio is kept when the link carries
S_emu in the time the real NIC carries 102.2 MB, divided by k:

    rate_emu = rate_real * (S_emu / S_real) * k = rate_real * 0.003326 * 4.03 = rate_real * 0.01341

so link class "100gbit" is shaped to 1.34 Gbit/s, "10gbit" to 134 Mbit/s, "1gbit" to 13.4,
"100mbit" to 1.34 (tc tbf on every host's egress). The ranks of a host reach each other over loopback and a ring with the
ranks placed host by host crosses each host's link once in each direction, as the one-GPU hosts
of the named setting do: sync's comm per step is 1.5 * 340,008 B / rate_emu = 30.4 ms = 0.61 *
50 ms at "10gbit" (N = 4). Not emulated: latency (this kernel has no netem), the real model's
CPU time (a few ms per step, which the 10gbit class feels most), and the per-tensor framing.

T_emu is the bed's ``--step_ms`` (default 50 ms); the link classes slow with it, so the ratio
holds at any T_emu. Eight ranks on two cores run at ``--step_ms=200`` (k = 1.01: the named
workload's own pace): each rank's own CPU work (about 19 ms a step) then fits in the cores,
where at 50 ms eight ranks' work saturated them and the run measured core sharing.

Straggler conditions (rank/worker 1 is the straggler, 4x, as the trainer's flags say):
  none, persistent (--compute_slow_worker=1:4), transient (1:4:FROMs:TOs, seconds after each
  worker's first step: the time sync takes for the middle third of its steps, so that sync
  meets what a window of steps gave it and every other mode the same stretch of time; a window
  of steps lasted longer under hybrid, whose slow worker runs its own steps at its own pace,
  than under sync), heavy (--compute_jitter=pareto:ALPHA on every worker: Pareto per-step
  times, the heavy-tailed execution-time model that Wang, Joshi and Wornell analyse for
  straggling tasks against Google's cluster trace, "Efficient Straggler Replication in
  Large-scale Parallel Computing", arXiv:1503.03128). ALPHA defaults to 2.0, our choice: no
  published fitted value was found for it, so the bed records it with the results.
"""
from __future__ import annotations

RESNET50_PARAMETERS = 25_557_032
REAL_GRADIENT_BYTES = RESNET50_PARAMETERS * 4
REAL_STEP_SECONDS = 256 / 1270.0
HIDDEN_UNITS = 256
FEATURES, CLASSES = 64, 10
EMU_STEP_MS = 50.0
LINK_CLASSES = {"100gbit": 100e9, "10gbit": 10e9, "1gbit": 1e9, "100mbit": 100e6}
STRAGGLERS = ("none", "persistent", "transient", "heavy")
SLOW_FACTOR = 4
TRAIN_SAMPLES = 1437  # the trainer's 4/5 of scikit-learn's 1797 digits


def emulated_parameters(hidden: int = HIDDEN_UNITS) -> int:
    return FEATURES * hidden + hidden + hidden * hidden + hidden + hidden * CLASSES + CLASSES


def time_scale(step_ms: float = EMU_STEP_MS) -> float:
    """k: how many times faster than the named workload the bed runs with `step_ms` a step."""
    return REAL_STEP_SECONDS * 1000.0 / step_ms


def link_bits_per_second(link: str, step_ms: float = EMU_STEP_MS) -> float:
    """The shaped rate of link class `link` for a bed of `step_ms` a step (see the module
    docstring): a slower step, a slower link, the same ratio."""
    return LINK_CLASSES[link] * emulated_parameters() * 4 / REAL_GRADIENT_BYTES * time_scale(step_ms)


def tc_rate(link: str, step_ms: float = EMU_STEP_MS) -> str:
    return f"{int(link_bits_per_second(link, step_ms) / 1000)}kbit"


def tc_burst(link: str, step_ms: float = EMU_STEP_MS) -> str:
    """tbf's bucket: 5 ms of the rate, at least 16 KB (tbf needs rate / HZ at the least)."""
    return f"{max(16, int(link_bits_per_second(link, step_ms) / 8 * 0.005 / 1024))}kb"


def ring_comm_seconds(ranks: int, link: str, step_ms: float = EMU_STEP_MS) -> float:
    """Sync's expected allreduce time per step on the shaped link (bytes only)."""
    return 2 * (ranks - 1) / ranks * emulated_parameters() * 4 * 8 / link_bits_per_second(link, step_ms)


def transient_window_seconds(steps_per_worker: int, ranks: int, link: str,
                             step_ms: float = EMU_STEP_MS) -> tuple:
    """(from, to): the transient straggler's window in seconds after a worker's first step: the
    time sync would take for the middle third of `steps_per_worker` steps (each its compute and
    its expected allreduce), the slow rank 4x slow in it. Sync meets the condition a window of
    steps gave it; other modes meet the same stretch of time."""
    third = steps_per_worker / 3
    comm = ring_comm_seconds(ranks, link, step_ms)
    first = third * (step_ms / 1000.0 + comm)
    return round(first, 2), round(first + third * (SLOW_FACTOR * step_ms / 1000.0 + comm), 2)


def straggler_flags(condition: str, steps_per_worker: int, pareto_alpha: float, ranks: int = 4,
                    link: str = "10gbit", step_ms: float = EMU_STEP_MS) -> list:
    """The trainer flags of a straggler condition, for a run of `steps_per_worker` steps of
    `ranks` ranks on `link` (the transient window's length depends on both)."""
    if condition == "none":
        return []
    if condition == "persistent":
        return [f"--compute_slow_worker=1:{SLOW_FACTOR}"]
    if condition == "transient":
        first, end = transient_window_seconds(steps_per_worker, ranks, link, step_ms)
        return [f"--compute_slow_worker=1:{SLOW_FACTOR}:{first:g}s:{end:g}s"]
    if condition == "heavy":
        return [f"--compute_jitter=pareto:{pareto_alpha:g}"]
    raise ValueError(f"straggler condition {condition!r}; use one of {', '.join(STRAGGLERS)}")
