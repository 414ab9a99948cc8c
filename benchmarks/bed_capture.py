"""Where an async step's time goes on the bed: packet headers captured on every host, read back
as each worker's steps.

    python -m benchmarks.bed --ranks=4 --link=10gbit --straggler=none --modes=async --repeats=1 \\
        --epochs=8 --capture_dir=/tmp/cap
    python -m benchmarks.bed_capture /tmp/cap

``--capture_dir`` runs ``tcpdump`` (headers only) on every host's interface while the bed's runs
go (:func:`capturing`). This module then reads the capture of the host of the chief and the ps
(the bed puts both on the host after the ranks' hosts; chief port 2222, ps port 2223, see
``benchmarks/bed_async.py``) and prints, per worker:

- its steps as the chief dispatches them: from one dispatch (the chief's call of 2 KB or more to
  the worker's server) to the next, split into dispatch to the push's first byte (the emulated
  compute, the pull of the variables and the real step), the push (the worker's bulk reply to
  the ps, which fetches the gradients it applies), and the push's last byte to the next dispatch
  (the coordinator's calls that end one step and start the next);

and, per host, how long each packet it sent waited below TCP (its capture after the host's
shaped queue against its TCP timestamp, each connection's least wait taken as zero), for bare
acknowledgements, other packets under 1 KB, and bulk. Diagnostics, one run: not figures.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict

from tfsync_testbed import netns

LINE = re.compile(r"^(\d+\.\d+) IP (\S+)\.(\d+) > (\S+)\.(\d+): Flags \[[^\]]*\].*?length (\d+)")
TSVAL = re.compile(r"TS val (\d+) ecr")
DISPATCH_BYTES = 2000  # the chief's call that starts a step (2.4 KB on the bed's model)
BULK_BYTES = 100000  # a transfer of the model (340 KB on the bed's model)
GAP_S = 0.008  # packets of one transfer come closer than this


@contextlib.contextmanager
def capturing(hosts, directory: str, iface: str):
    """``tcpdump`` of 128-byte headers on `iface` of every host into ``directory/hN.pcap``."""
    os.makedirs(directory, exist_ok=True)
    processes = [host.popen(["tcpdump", "-i", iface, "-s", "128", "-U", "-w",
                             os.path.join(directory, f"h{host.index}.pcap")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for host in hosts]
    try:
        yield
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def packets(pcap: str):
    """(seconds, source, source port, destination, destination port, payload bytes, TSval)."""
    text = subprocess.run(["tcpdump", "-tt", "-nn", "-r", pcap], capture_output=True, text=True,
                          timeout=600).stdout
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            t, src, sport, dst, dport, length = match.groups()
            ts = TSVAL.search(line)
            yield float(t), src, int(sport), dst, int(dport), int(length), int(ts.group(1)) if ts else None


def transfers(times_and_sizes):
    """Bulk transfers, each [first byte, last byte, bytes], from one direction's packets."""
    out, current = [], None
    for t, n in times_and_sizes:
        if current and t - current[1] <= GAP_S:
            current[1], current[2] = t, current[2] + n
        else:
            if current and current[2] >= BULK_BYTES:
                out.append(current)
            current = [t, t, n]
    if current and current[2] >= BULK_BYTES:
        out.append(current)
    return out


def worker_steps(rows, me: str):
    """Per worker server (address:port): the medians of its steps' parts, in ms."""
    flows = defaultdict(list)  # (src, sport, dst, dport) -> [(t, n)]
    for t, src, sport, dst, dport, n, _ in rows:
        if n:
            flows[(src, sport, dst, dport)].append((t, n))
    servers = {(dst, dport) for (src, _, dst, dport) in flows if src == me and dport in (2222, 2223) and dst != me}
    report = {}
    for server in sorted(servers):
        clients = [k for k in flows if k[0] == me and (k[2], k[3]) == server]
        dispatch = [t for k in clients for t, n in flows[k] if n >= DISPATCH_BYTES]
        pushes = [b for k, seen in flows.items() if (k[0], k[1], k[2]) == (server[0], server[1], me)
                  for b in transfers(seen)]  # on the ps's own connection to the server
        dispatch.sort()
        pushes.sort()
        parts = defaultdict(list)
        for start, end in zip(dispatch, dispatch[1:]):
            push = next((p for p in pushes if start < p[0] < end), None)
            if push is None:
                continue
            parts["step"].append(end - start)
            parts["dispatch to push"].append(push[0] - start)
            parts["push"].append(push[1] - push[0])
            parts["push to next dispatch"].append(end - push[1])
        if parts:
            report[f"{server[0]}:{server[1]}"] = {k: 1000 * statistics.median(v) for k, v in parts.items()} | {
                "steps": len(parts["step"])}
    return report


def queue_waits(rows, me: str):
    """Per kind of packet `me` sent: the median, mean and 90th percentile of its wait (ms)."""
    offsets = defaultdict(list)
    for t, src, sport, dst, dport, n, tsval in rows:
        if src == me and tsval is not None:
            offsets[(sport, dst, dport)].append((t * 1000 - tsval, n))
    waits = defaultdict(list)
    for seen in offsets.values():
        least = min(o for o, _ in seen)
        for o, n in seen:
            waits["ack" if n == 0 else "small" if n < 1024 else "bulk"].append(o - least)
    return {k: (statistics.median(v), statistics.mean(v), sorted(v)[int(0.9 * len(v))]) for k, v in waits.items()}


def main(argv) -> None:
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        sys.exit("usage: python -m benchmarks.bed_capture DIR (a --capture_dir of benchmarks.bed)")
    pcaps = sorted(glob.glob(os.path.join(argv[1], "h*.pcap")), key=lambda p: int(p.rsplit("h", 1)[1][:-5]))
    for pcap in pcaps:
        rows = list(packets(pcap))
        me = f"{netns.SUBNET}.{int(os.path.basename(pcap)[1:-5]) + 1}"  # host i's address
        print(f"{os.path.basename(pcap)} ({me}): waits below TCP, ms (median, mean, 90th percentile):")
        for kind, (median, mean, p90) in sorted(queue_waits(rows, me).items()):
            print(f"  {kind:5s} {median:6.1f} {mean:6.1f} {p90:6.1f}")
        if pcap == pcaps[-1]:  # the chief's and the ps's host
            for server, parts in worker_steps(rows, me).items():
                print(f"  worker at {server}: {parts['steps']} steps, ms (medians): " + ", ".join(
                    f"{k} {v:.1f}" for k, v in parts.items() if k != "steps"))


if __name__ == "__main__":
    main(sys.argv)
