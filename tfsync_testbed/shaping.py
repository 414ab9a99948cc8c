"""The ``tc`` commands that shape a bed host's link (:meth:`tfsync_testbed.netns.HostBed.shape`).

One queue: a token bucket (``tbf``) at the link's rate whose queue holds `latency` of it, as
every bed file before ``first_bytes`` was taken. With ``first_bytes`` N, packets under N bytes
(N = 128: bare TCP acknowledgements) have a queue of their own, served first, and the rest the
one queue: ``htb`` classes 1:10 (priority 0) and 1:20 (priority 1), each guaranteed a share and
both allowed the whole rate with the link's burst (htb's own default, one packet, throttles a
class that borrows). A host's flow queuing (``fq_codel``, Linux's usual default) keeps
acknowledgements from waiting behind another connection's bulk data; this kernel has ``tbf``
and ``htb`` only, so size stands in for the flow. Above bare acknowledgements (a small
request, a bulk stream's short last segment), size also lets a connection's later packet pass
its earlier ones, and TCP counts that as loss.
"""
from __future__ import annotations

import re
from typing import List

IFACE = "tfs0"  # the veth inside every host (netns.IFACE)


def bits_per_second(rate: str) -> float:
    """``tc``'s rate `rate` ("100mbit", "134086kbit") in bits a second."""
    match = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate.lower())
    if not match:
        raise ValueError(f"rate {rate!r}: use e.g. 100mbit, 134086kbit")
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def first_bytes_ok(first_bytes: int) -> bool:
    """0 (one queue), or a power of two from 64 to 4096 (the filter matches the IPv4 length's
    high bits)."""
    return first_bytes == 0 or (64 <= first_bytes <= 4096 and first_bytes & (first_bytes - 1) == 0)


def tc_commands(rate: str, burst: str, latency: str, first_bytes: int = 0) -> List[List[str]]:
    """The ``tc`` arguments, in order, that shape the host's :data:`IFACE` (its root cleared)."""
    dev = ["dev", IFACE]
    if not first_bytes:
        return [["qdisc", "add", *dev, "root", "tbf", "rate", rate, "burst", burst, "latency", latency]]
    if not first_bytes_ok(first_bytes):
        raise ValueError(f"first_bytes={first_bytes}: use 0, or a power of two from 64 to 4096")
    bits = bits_per_second(rate)
    return [["qdisc", "add", *dev, "root", "handle", "1:", "htb", "default", "20"],
            ["class", "add", *dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate, "burst", burst, "cburst", burst],
            ["class", "add", *dev, "parent", "1:1", "classid", "1:10", "htb", "rate", f"{int(bits / 10)}bit",
             "ceil", rate, "burst", burst, "cburst", burst, "prio", "0"],
            ["class", "add", *dev, "parent", "1:1", "classid", "1:20", "htb", "rate", f"{int(bits * 0.9)}bit",
             "ceil", rate, "burst", burst, "cburst", burst, "prio", "1"],
            # the rest queued as on the one-queue link (tbf also cuts a segmentation-offload packet)
            ["qdisc", "add", *dev, "parent", "1:20", "handle", "20:", "tbf", "rate", rate, "burst", burst,
             "latency", latency],
            # the IPv4 total length (bytes 2-3 of the header) below first_bytes
            ["filter", "add", *dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
             "match", "u16", "0x0000", f"0x{0xffff & ~(first_bytes - 1):04x}", "at", "2", "flowid", "1:10"]]
