"""Async on the emulated cluster bed: where its tasks go and one run across the namespaces.

The chief and the parameter servers run on hosts of their own (the bed's last ``ps`` hosts, the
chief beside the first ps), each host link shaped alike, the workers over the ranks' hosts
round-robin, so that every worker's pushes and pulls cross the shaped links. More than one ps
splits every kernel over them (``--sync_ps_shards``, ``--sync_min_shard_bytes``), which only
tf_keras can update (``TF_USE_LEGACY_KERAS=1``; Keras 3 optimizers refuse ShardedVariable): the
bed says so in its file.
"""
from __future__ import annotations

import subprocess
import time
from typing import Sequence

from tfsync_testbed import localrun


def cluster(hosts: Sequence, ranks: int, rank_hosts: int, ps: int = 1) -> dict:
    """The cluster spec: the chief on the first ps host (port 2222), ps task i on host
    ``rank_hosts + i`` (port 2223), worker i on rank host ``i % rank_hosts``."""
    ps_hosts, workers = hosts[rank_hosts:rank_hosts + ps], hosts[:rank_hosts]
    if len(ps_hosts) != ps:
        raise ValueError(f"{len(hosts)} hosts hold {rank_hosts} rank hosts and {ps} ps hosts only if there are "
                         f"{rank_hosts + ps}")
    return {"chief": [f"{ps_hosts[0].address}:2222"], "ps": [f"{h.address}:2223" for h in ps_hosts],
            "worker": [f"{workers[i % rank_hosts].address}:{2222 + i // rank_hosts}" for i in range(ranks)]}


SHARD_BYTES = 4096  # the bed's MLP's kernels (10-256 KiB) split, its biases (<= 1 KiB) whole


def flags_for(ps: int) -> list:
    """The trainer's flags of an async run with `ps` parameter servers: every kernel split over
    them (the default smallest part, 256 KiB, would leave the bed's whole model on one ps)."""
    return [f"--sync_ps_shards={ps}", f"--sync_min_shard_bytes={SHARD_BYTES}"] if ps > 1 else []


def describe(ps: int) -> str:
    """Where the async tasks ran, as the bed file's ``async_on`` says it (the cost model reads
    its first word: namespaces, not loopback)."""
    if ps == 1:
        return "namespaces: the chief and the ps on a host of their own, shaped alike"
    return (f"namespaces: the chief and {ps} ps on hosts of their own, shaped alike, every kernel split "
            "over them under tf_keras")


def env_for(env: dict, ps: int) -> dict:
    """Sharded variables need tf_keras's optimizers."""
    return dict(env, TF_USE_LEGACY_KERAS="1") if ps > 1 else env


def run(hosts: Sequence, spec: dict, env: dict, command: list, work: str, cwd: str,
        timeout: float) -> subprocess.CompletedProcess:
    """One async run: every task `command` with its TF_CONFIG on its host; the chief's status is
    the run's; every task's process group is killed at the end."""
    from tfsyncmodes.tf_configs import tf_config

    by_address = {h.address: h for h in hosts}
    tasks = {}
    try:
        for role in ("ps", "worker", "chief"):
            for index, address in enumerate(spec[role]):
                host = by_address[address.rsplit(":", 1)[0]]
                with open(f"{work}/{role}{index}.log", "w", encoding="utf-8") as log:  # the task keeps its copy
                    tasks[(role, index)] = host.popen(command, env=dict(env, TF_CONFIG=tf_config(spec, role, index)),
                                                      cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        try:
            status = tasks[("chief", 0)].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = -9
        deadline = time.monotonic() + 30  # the ps and workers leave once the chief has gone
        for process in tasks.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for process in tasks.values():
            localrun.kill_group(process)
            process.wait()
    tail = {name: open(f"{work}/{name[0]}{name[1]}.log", encoding="utf-8", errors="replace").read()[-3000:]
            for name in tasks}
    return subprocess.CompletedProcess(command, status, stdout=tail.get(("chief", 0), ""),
                                       stderr="".join(f"--- {r}:{i}\n{t}" for (r, i), t in tail.items()
                                                      if r != "chief"))
