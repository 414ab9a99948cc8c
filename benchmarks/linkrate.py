"""The measured TCP rate of a bed's link: one stream from host A to host B for 2 s (bytes/s);
shared by the benchmarks that shape the link between namespace hosts."""
from __future__ import annotations

import subprocess
import sys

BLAST = r"""
import socket, sys, time
if sys.argv[1] == "serve":
    s = socket.create_server((sys.argv[2], 5201)); print("up", flush=True)
    c, _ = s.accept(); total = 0; t0 = time.perf_counter()
    while True:
        data = c.recv(1 << 20)
        if not data: break
        total += len(data)
    print(total / (time.perf_counter() - t0))
else:
    c = socket.create_connection((sys.argv[2], 5201)); chunk = b"x" * (1 << 20); end = time.perf_counter() + 2
    while time.perf_counter() < end: c.sendall(chunk)
    c.close()
"""


def link_rate(bed) -> float:
    """Bytes/s of one TCP stream from the first host to the second for 2 s (every host's link is
    shaped alike, so any pair measures the class)."""
    a, b = bed.hosts[:2]
    server = b.popen([sys.executable, "-c", BLAST, "serve", b.address], stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        a.run([sys.executable, "-c", BLAST, "send", b.address], timeout=60)
        return float(server.communicate(timeout=60)[0].strip())
    finally:
        server.kill()
        server.wait()
