"""One ``TF_CONFIG`` per task of a cluster spread over named hosts.

``python -m tfsyncmodes.launch --print-tf-config --hosts a,b --workers 2 --ps 1`` prints
them, for tasks started by hand or by another scheduler. Placement: the chief on the first
host, then the ps and worker tasks round-robin over the hosts (ps first, so that with as many
hosts as tasks every task has a host of its own); on each host the tasks take consecutive ports
from ``--port``. With ``--ps 0`` the cluster is ``MultiWorkerMirroredStrategy``'s: workers
only, worker 0 acting as chief.
"""
from __future__ import annotations

import json
from typing import Dict, List, Sequence, Tuple

DEFAULT_PORT = 2222


def plan(hosts: Sequence[str], workers: int, ps: int, port: int = DEFAULT_PORT) -> Tuple[Dict[str, List[str]], List[Tuple[str, int, str]]]:
    """(cluster, tasks): the cluster spec, and (role, index, host) of every task in start order
    (ps first, the chief last)."""
    next_port = {host: port for host in hosts}
    placed: List[Tuple[str, int, str]] = []

    def place(role: str, index: int, host: str) -> str:
        address = f"{host}:{next_port[host]}"
        next_port[host] += 1
        placed.append((role, index, host))
        return address

    cluster: Dict[str, List[str]] = {}
    if ps:
        cluster["chief"] = [place("chief", 0, hosts[0])]
    turn = 1 if ps else 0  # the chief's host takes its turn last
    for role, count in (("ps", ps), ("worker", workers)):
        addresses = []
        for index in range(count):
            addresses.append(place(role, index, hosts[turn % len(hosts)]))
            turn += 1
        if addresses:
            cluster[role] = addresses
    order = {"ps": 0, "worker": 1, "chief": 2}
    placed.sort(key=lambda task: (order[task[0]], task[1]))
    return cluster, placed


def tf_config(cluster: Dict[str, List[str]], role: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index}}, separators=(",", ":"))


def render(hosts: Sequence[str], workers: int, ps: int, port: int = DEFAULT_PORT) -> str:
    """The text ``--print-tf-config`` prints: per task, a comment naming it and its host, then
    a shell assignment of its TF_CONFIG."""
    cluster, tasks = plan(hosts, workers, ps, port)
    lines = [f"# cluster: {json.dumps(cluster)}"]
    for role, index, host in tasks:
        lines.append(f"# {role}:{index} on {host}")
        lines.append(f"TF_CONFIG='{tf_config(cluster, role, index)}'")
    return "\n".join(lines) + "\n"
