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

With ``flows`` F (16), each connection is queued on its own, as a Linux host's ``fq_codel``
keeps them: F ``htb`` classes, each with the one-queue link's ``tbf`` (its rate and its
`latency`) and a share of 1/F guaranteed, all of the same priority and each allowed the whole
rate, so that htb serves the classes with data in turn (deficit round robin, a packet's worth
each) and a connection alone has the whole link. A TCP or UDP packet's class is the sum of its
ports' low four bits, modulo F: two ``u32`` hash levels, the source port's nibble, then the
destination port's, so that two connections to one server port from two client ports (two
workers pulling from one ps) part as often as the client ports' nibbles differ (15 in 16 for
ports the kernel picks), and a connection's two directions are classed alike. Other packets
(ARP, ICMP) take the first class. Packets of one connection stay in order.
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


FLOWS = 16  # the classes of ``flows`` (one hash level's buckets)


def flows_ok(flows: int) -> bool:
    """0 (no flow queues), or :data:`FLOWS`."""
    return flows in (0, FLOWS)


def tc_commands(rate: str, burst: str, latency: str, first_bytes: int = 0, flows: int = 0) -> List[List[str]]:
    """The ``tc`` arguments, in order, that shape the host's :data:`IFACE` (its root cleared)."""
    dev = ["dev", IFACE]
    if flows:
        if first_bytes or not flows_ok(flows):
            raise ValueError(f"flows={flows} (first_bytes={first_bytes}): use flows={FLOWS} with first_bytes=0")
        return flow_commands(rate, burst, latency)
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


def flow_commands(rate: str, burst: str, latency: str) -> List[List[str]]:
    """``flows``: a class a connection (see the module doc)."""
    dev, bits = ["dev", IFACE], bits_per_second(rate)
    leaf = [f"1:{0x100 + k:x}" for k in range(FLOWS)]
    u32 = ["filter", "add", *dev, "parent", "1:", "prio", "1", "protocol", "ip"]
    commands = [["qdisc", "add", *dev, "root", "handle", "1:", "htb", "default", f"{0x100:x}"],
                ["class", "add", *dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate, "burst", burst, "cburst", burst,
                 "quantum", "1514"]]  # (an inner class's quantum is unused; this keeps tc from warning)
    for k, classid in enumerate(leaf):
        commands += [["class", "add", *dev, "parent", "1:1", "classid", classid, "htb", "rate", f"{int(bits / FLOWS)}bit",
                      "ceil", rate, "burst", burst, "cburst", burst, "prio", "1", "quantum", "1514"],
                     ["qdisc", "add", *dev, "parent", classid, "handle", f"{0x100 + k:x}:", "tbf", "rate", rate,
                      "burst", burst, "latency", latency]]
    # Table 2: by the source port's low nibble; tables 10-1f: then by the destination port's.
    commands.append([*u32, "handle", "2:", "u32", "divisor", str(FLOWS)])
    for i in range(FLOWS):
        commands.append([*u32, "handle", f"{0x10 + i:x}:", "u32", "divisor", str(FLOWS)])
        for j in range(FLOWS):
            commands.append([*u32, "u32", "ht", f"{0x10 + i:x}:{j:x}:", "match", "u32", "0", "0",
                             "flowid", leaf[(i + j) % FLOWS]])
        commands.append([*u32, "u32", "ht", f"2:{i:x}:", "match", "u32", "0", "0",
                         "link", f"{0x10 + i:x}:", "hashkey", "mask", f"0x{FLOWS - 1:08x}", "at", "20"])
    for protocol in ("6", "17"):  # TCP, UDP: the ports are the word after a 20-byte IPv4 header
        commands.append([*u32, "u32", "ht", "800::", "match", "ip", "protocol", protocol, "0xff",
                         "link", "2:", "hashkey", "mask", f"0x{(FLOWS - 1) << 16:08x}", "at", "20"])
    return commands
