"""Which GPUs a process uses, decided the way Horovod's and tf.distribute's users expect.

- **Horovod rank** (sync, hybrid, switching under ``horovodrun``): only its local GPU,
  ``gpus[local_rank]``, with memory growth on (step 2 of Horovod's own checklist), so that
  four ranks on a four-GPU host do not each allocate memory on every GPU. With fewer visible
  GPUs than local ranks, ranks share them round-robin (and the log line says so).
- **Parameter-server task**: a ``worker`` (and the ``chief``, which runs the coordinator and
  evaluation) keeps the GPUs its host assigned it (``CUDA_VISIBLE_DEVICES``), with memory
  growth; a ``ps`` task sees no GPU (it only stores and updates variables, on its CPU).
- **MirroredStrategy / MultiWorkerMirroredStrategy**: every local GPU, memory growth on.
- **A user who already chose**: when the visible GPUs differ from the physical ones
  (``tf.config.set_visible_devices`` before ``make_strategy``) nothing is changed.

:func:`plan` decides from the device lists alone (no TensorFlow state is touched), so the
decision is tested on a machine without GPUs; :func:`apply` carries a plan out with
``tf.config`` and must run before TensorFlow initialises its devices (``make_strategy``
calls it first thing). Without GPUs the plan is "CPU" and nothing is called.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple

import tensorflow as tf
from absl import logging

HOROVOD, WORKER, PS, ALL_LOCAL = "horovod", "worker", "ps", "all_local"


@dataclasses.dataclass(frozen=True)
class DevicePlan:
    """What a process should see: the GPUs to make visible (None: leave visibility as it is)
    and those to grow memory on, with one line saying why."""

    visible: Optional[Tuple[str, ...]]
    memory_growth: Tuple[str, ...]
    reason: str


def plan(role: str, physical: Sequence[str], visible: Sequence[str], local_rank: int = 0,
         local_size: int = 1) -> DevicePlan:
    """The device plan of a process in `role` (``horovod``, ``worker``, ``ps``,
    ``all_local``) given the names of the physical GPUs and of the GPUs visible now."""
    physical, visible = tuple(physical), tuple(visible)
    if not physical:
        return DevicePlan(None, (), "no GPU: this process runs on the CPU")
    if visible != physical:
        return DevicePlan(None, (), f"GPUs chosen by the program kept: {', '.join(visible) or 'none'}")
    if role == PS:
        return DevicePlan((), (), "parameter server: no GPU (variables live on its CPU)")
    if role == HOROVOD:
        if local_rank < 0 or local_size < 1:
            raise ValueError(f"local rank {local_rank} of {local_size}")
        gpu = physical[local_rank % len(physical)]
        shared = f" (shared: {local_size} local ranks, {len(physical)} GPUs)" if local_size > len(physical) else ""
        return DevicePlan((gpu,), (gpu,), f"local rank {local_rank}: {gpu}{shared}")
    if role in (WORKER, ALL_LOCAL):
        return DevicePlan(None, physical, f"{len(physical)} GPU(s): {', '.join(physical)}")
    raise ValueError(f"unknown role {role!r}")


def apply(device_plan: DevicePlan) -> None:
    """Carries out `device_plan` with ``tf.config`` (before TensorFlow initialises devices;
    if it already has, the unchanged setting is kept and the log line says so)."""
    by_name = {d.name: d for d in tf.config.list_physical_devices("GPU")}
    try:
        for name in device_plan.memory_growth:
            tf.config.experimental.set_memory_growth(by_name[name], True)
        if device_plan.visible is not None:
            tf.config.set_visible_devices([by_name[n] for n in device_plan.visible], "GPU")
    except RuntimeError as error:  # devices were initialised before the strategy was made
        logging.warning("tfsyncmodes: GPUs: %s; not changed: %s (make the strategy before other "
                        "TensorFlow work)", device_plan.reason, error)
        return
    logging.info("tfsyncmodes: GPUs: %s", device_plan.reason)


def place(role: str, local_rank: int = 0, local_size: int = 1) -> DevicePlan:
    """Plans and applies this process's devices from what TensorFlow lists."""
    device_plan = plan(role, [d.name for d in tf.config.list_physical_devices("GPU")],
                       [d.name for d in tf.config.get_visible_devices("GPU")], local_rank, local_size)
    if device_plan.visible is not None or device_plan.memory_growth:
        apply(device_plan)
    return device_plan
