"""Which mode pays for a job, from its numbers, without a cluster: the cost model of
:mod:`tfsyncmodes.costs` on the figures you give.

    python -m tfsyncmodes.advise --ranks 64 --ranks_per_host 8 --step_ms 180 --grad_mb 98 \\
        --link_gbit 10 --straggler 4

prints each mode's predicted throughput (samples per second, and as a ratio to sync's) and the
mode of highest throughput. It does not predict how many samples each mode needs to reach an
accuracy: async and hybrid usually need more than sync, so a small lead is not worth a switch.
"""
from __future__ import annotations

from absl import flags

from tfsyncmodes import costs, simulate
from tfsyncmodes.errors import ConfigError, run

flags.DEFINE_integer("ranks", 8, "Ranks (processes, one per GPU).", lower_bound=1)
flags.DEFINE_integer("ranks_per_host", 1, "Ranks on one host (hybrid makes a group of each host).", lower_bound=1)
flags.DEFINE_float("step_ms", 100.0, "Median compute time of one training step on one rank, ms.")
flags.DEFINE_float("grad_mb", 100.0, "Gradient size (4 bytes per float32 parameter), MB.")
flags.DEFINE_float("link_gbit", 10.0, "Network between hosts, Gbit/s.")
flags.DEFINE_float("host_gbit", 100.0, "Link between the ranks of one host (NVLink, PCIe, shared memory), Gbit/s.")
flags.DEFINE_float("latency_us", 50.0, "Latency of one message, microseconds.")
flags.DEFINE_integer("batch", 64, "Samples per rank and step.", lower_bound=1)
flags.DEFINE_float("straggler", 1.0, "One rank is this many times slower (1: none).")
flags.DEFINE_float("tail_sigma", 0.0, "Heavy-tailed per-step delays: lognormal shape (0: none; 0.5: a "
                   "few steps several times the median).")
flags.DEFINE_integer("period", 8, "Hybrid: inner steps between two averages across hosts.", lower_bound=1)
flags.DEFINE_enum("local_steps", "auto", ["fixed", "auto"], "Hybrid: fixed or speed-proportional local steps.")
flags.DEFINE_integer("ps", 1, "Async: parameter servers.", lower_bound=1)
flags.DEFINE_float("ps_gbit", 0.0, "Async: each parameter server's link, Gbit/s (0: --link_gbit).")
flags.DEFINE_float("down_gbit", 0.0, "Async: a worker's incoming link, Gbit/s, where it differs from what it sends "
                   "(0: --link_gbit).")
FLAGS = flags.FLAGS

FIELDS = ("ranks", "ranks_per_host", "step_ms", "grad_mb", "link_gbit", "host_gbit", "latency_us", "batch",
          "straggler", "tail_sigma", "period", "local_steps", "ps", "ps_gbit", "down_gbit")


def report(job: costs.Job) -> str:
    predicted = simulate.predict(job)
    lines = [f"{'mode':<8}{'samples/s':>14}{'of sync':>10}"]
    for mode in costs.MODES:
        lines.append(f"{mode:<8}{predicted[mode]:>14,.0f}{predicted[mode] / predicted['sync']:>10.2f}")
    pick = costs.best(predicted)
    lines.append(f"highest throughput: {pick} ({predicted[pick] / predicted['sync']:.2f}x sync's); "
                 "throughput only, not samples to an accuracy")
    return "\n".join(lines)


def main(argv) -> None:
    del argv
    try:
        job = costs.Job(**{name: FLAGS[name].value for name in FIELDS})
    except ValueError as error:
        name = str(error).split("=", 1)[0]
        raise ConfigError("flag", f"--{name}", str(error).split(": ", 1)[0] + " is not accepted",
                          str(error).split(": ", 1)[1]) from None
    print(report(job))


if __name__ == "__main__":
    run(main)
