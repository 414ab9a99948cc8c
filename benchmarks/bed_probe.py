"""What the emulated cluster bed records about the machine around each run, so that a run's
figures can be read against what held it back: per host, the packets its shaped link dropped
and the TCP segments it sent again (:meth:`tfsync_testbed.netns.HostBed.counters`), and the
machine's cores busy on average (``/proc/stat``: on 2 cores, 2.0 means the ranks, tasks and
everything else had no core to spare)."""
from __future__ import annotations

import os
from typing import Tuple


def cpu_times(path: str = "/proc/stat") -> Tuple[int, int]:
    """(busy, total) jiffies of all cores since boot; idle and iowait are not busy."""
    with open(path, encoding="ascii") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
    return total - fields[3] - fields[4], total


class Probe:
    """Counters read when a run starts; :meth:`read` gives what changed since."""

    def __init__(self, bed, cores: int = 0):
        self.bed, self.cores = bed, cores or os.cpu_count() or 1
        self.links, self.cpu = bed.counters(), cpu_times()

    def read(self) -> dict:
        links, (busy, total) = self.bed.counters(), cpu_times()
        spent = max(total - self.cpu[1], 1)
        return {"link": {k: [a[k] - b[k] for a, b in zip(links, self.links)] for k in self.links[0]},
                "cores_busy": round(self.cores * (busy - self.cpu[0]) / spent, 3)}
