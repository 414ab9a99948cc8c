"""Where this process stands in the job: parsed from TF_CONFIG and from Horovod's environment.

Both are read once, validated, and returned as immutable values. Nothing here starts a server
or initialises Horovod; the strategies do that with what these objects say.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping, Optional, Tuple

from tfsyncmodes.errors import ConfigError, one_of

ROLES = ("chief", "worker", "ps", "evaluator")
TF_CONFIG = "TF_CONFIG"


@dataclasses.dataclass(frozen=True)
class TFConfig:
    """A validated TF_CONFIG: the cluster (role -> addresses) and this task."""

    cluster: Mapping[str, Tuple[str, ...]]
    task_type: str
    task_index: int

    def num_tasks(self, role: str) -> int:
        return len(self.cluster.get(role, ()))

    @property
    def num_workers(self) -> int:
        """Tasks that compute gradients: the chief (if any) and the workers."""
        return self.num_tasks("chief") + self.num_tasks("worker")

    @property
    def is_chief(self) -> bool:
        if "chief" in self.cluster:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    def require_roles(self, mode: str, allowed: Tuple[str, ...], required: Tuple[str, ...]) -> None:
        """Fail unless every role in the cluster is `allowed` and every `required` one exists."""
        for role in self.cluster:
            if role not in allowed:
                raise ConfigError(
                    TF_CONFIG, f"cluster.{role}",
                    f"role '{role}' is not used by --sync_mode={mode}",
                    f"remove it or use roles {', '.join(allowed)}")
        for role in required:
            if not self.cluster.get(role):
                raise ConfigError(
                    TF_CONFIG, f"cluster.{role}",
                    f"--sync_mode={mode} needs at least one '{role}' task", f"add a '{role}' list")


class _DuplicateKey(Exception):
    pass


def _refuse_duplicate_keys(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def _check_address(address: str, field: str) -> None:
    """`address` is host:port (host a name, an IPv4 address or a bracketed IPv6 one) with a
    port in 1..65535."""
    host, _, port = address.rpartition(":")
    fix = "give host:port with a port in 1..65535, e.g. 10.0.0.1:2222"
    if not host or host.strip() != host or (":" in host and not (host.startswith("[") and host.endswith("]"))):
        raise ConfigError(TF_CONFIG, field, f"{address!r} has no valid host", fix + " or [::1]:2222")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(TF_CONFIG, field, f"port {port!r} of {address!r} is not a number in 1..65535", fix)


def _parse_tf_config(text: str) -> TFConfig:
    try:
        raw = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except _DuplicateKey as duplicate:
        raise ConfigError(TF_CONFIG, str(duplicate), "is given twice", "name each role and key once") from None
    except json.JSONDecodeError as error:
        raise ConfigError(TF_CONFIG, "(json)", f"not valid JSON ({error.msg} at char {error.pos})",
                          'set it to {"cluster": {...}, "task": {"type": ..., "index": ...}}')
    if not isinstance(raw, dict):
        raise ConfigError(TF_CONFIG, "(json)", "must be a JSON object",
                          'set it to {"cluster": {...}, "task": {"type": ..., "index": ...}}')
    cluster = raw.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError(TF_CONFIG, "cluster", "missing or empty",
                          'give a map of role -> ["host:port", ...], e.g. {"worker": ["127.0.0.1:2222"]}')
    parsed = {}
    seen = {}
    for role, addresses in cluster.items():
        if role not in ROLES:
            raise ConfigError(TF_CONFIG, f"cluster.{role}", f"unknown role '{role}'", one_of(ROLES))
        if not isinstance(addresses, list) or not addresses or not all(isinstance(a, str) and ":" in a
                                                                      for a in addresses):
            raise ConfigError(TF_CONFIG, f"cluster.{role}", "must be a non-empty list of 'host:port' strings",
                              'e.g. ["127.0.0.1:2222"]')
        if role == "chief" and len(addresses) > 1:
            raise ConfigError(TF_CONFIG, "cluster.chief", f"{len(addresses)} chiefs given",
                              "a cluster has at most one chief")
        for index, address in enumerate(addresses):
            _check_address(address, f"cluster.{role}[{index}]")
            if address in seen:
                raise ConfigError(TF_CONFIG, f"cluster.{role}[{index}]",
                                  f"address {address} is also {seen[address]}",
                                  "give every task its own host:port")
            seen[address] = f"{role}[{index}]"
        parsed[role] = tuple(addresses)
    if raw.get("rpc_layer", "grpc") != "grpc":  # the only protocol TensorFlow's builds serve
        raise ConfigError(TF_CONFIG, "rpc_layer", f"{raw['rpc_layer']!r} is not served by TensorFlow",
                          'use "grpc", or leave rpc_layer out')
    task = raw.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise ConfigError(TF_CONFIG, "task", "missing, or has no 'type'",
                          'add "task": {"type": "worker", "index": 0}')
    task_type = task["type"]
    if task_type not in parsed:
        raise ConfigError(TF_CONFIG, "task.type", f"'{task_type}' is not a role of the cluster",
                          one_of(sorted(parsed)))
    task_index = task.get("index", 0)
    if not isinstance(task_index, int) or isinstance(task_index, bool):
        raise ConfigError(TF_CONFIG, "task.index", f"{task_index!r} is not an integer",
                          f"use 0..{len(parsed[task_type]) - 1}")
    if not 0 <= task_index < len(parsed[task_type]):
        raise ConfigError(TF_CONFIG, "task.index",
                          f"{task_index} is out of range for role '{task_type}' with "
                          f"{len(parsed[task_type])} task(s)",
                          f"use 0..{len(parsed[task_type]) - 1}")
    return TFConfig(cluster=parsed, task_type=task_type, task_index=task_index)


def tf_config(environ: Mapping[str, str] = os.environ) -> Optional[TFConfig]:
    """The parsed TF_CONFIG, or None when it is unset or empty."""
    text = environ.get(TF_CONFIG, "").strip()
    return _parse_tf_config(text) if text else None


@dataclasses.dataclass(frozen=True)
class HorovodEnv:
    """Rank and size as ``horovodrun`` (Gloo) or ``mpirun`` exports them."""

    rank: int
    size: int
    local_rank: int
    local_size: int


_HOROVOD_VARS = (
    ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def horovod_env(environ: Mapping[str, str] = os.environ) -> Optional[HorovodEnv]:
    """This process's Horovod coordinates, or None when not launched by horovodrun/mpirun."""
    for names in _HOROVOD_VARS:
        if names[0] not in environ:
            continue
        values = []
        for name in names:
            text = environ.get(name, "0" if "LOCAL" in name else "")
            try:
                values.append(int(text))
            except ValueError:
                raise ConfigError("environment", name, f"{text!r} is not an integer",
                                  "launch with horovodrun, which sets it")
        env = HorovodEnv(*values)
        if env.local_size == 0:
            env = dataclasses.replace(env, local_size=env.size)
        if not (0 <= env.rank < env.size):
            raise ConfigError("environment", names[0], f"rank {env.rank} is outside 0..{env.size - 1}",
                              "launch with horovodrun, which sets it")
        return env
    return None
