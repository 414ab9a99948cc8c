"""GPU placement as Horovod and tf.distribute users expect (tfsyncmodes/strategies/devices.py),
decided from device lists (this machine has no GPU), and ``jit_compile=True`` made safe on the
Horovod path in a real horovodrun job."""
import json
import os

import pytest

from tests.conftest import PYTHON, REPO, WORKERS, clean_env, run_checked
from tfsyncmodes.strategies import devices
from tfsync_testbed import localrun

GPUS = [f"/physical_device:GPU:{i}" for i in range(4)]


@pytest.mark.parametrize("rank", range(4))
def test_a_horovod_rank_sees_only_its_local_gpu_with_memory_growth(rank):
    plan = devices.plan(devices.HOROVOD, GPUS, GPUS, local_rank=rank, local_size=4)
    assert plan.visible == (GPUS[rank],) and plan.memory_growth == (GPUS[rank],)
    assert "shared" not in plan.reason


def test_more_local_ranks_than_gpus_share_them_round_robin_and_say_so():
    chosen = [devices.plan(devices.HOROVOD, GPUS[:2], GPUS[:2], r, 4).visible for r in range(4)]
    assert chosen == [(GPUS[0],), (GPUS[1],), (GPUS[0],), (GPUS[1],)]
    assert "shared: 4 local ranks, 2 GPUs" in devices.plan(devices.HOROVOD, GPUS[:2], GPUS[:2], 3, 4).reason


def test_parameter_server_tasks_workers_and_mirrored():
    ps = devices.plan(devices.PS, GPUS, GPUS)
    assert ps.visible == () and ps.memory_growth == ()
    for role in (devices.WORKER, devices.ALL_LOCAL):  # the host's GPUs (CUDA_VISIBLE_DEVICES), all
        plan = devices.plan(role, GPUS[:2], GPUS[:2])
        assert plan.visible is None and plan.memory_growth == tuple(GPUS[:2])


def test_devices_the_program_chose_are_kept():
    for role in (devices.HOROVOD, devices.WORKER, devices.PS, devices.ALL_LOCAL):
        plan = devices.plan(role, GPUS, GPUS[2:3], local_rank=0, local_size=4)
        assert plan.visible is None and plan.memory_growth == () and "kept" in plan.reason


def test_without_gpus_nothing_changes_on_this_machine():
    for role in (devices.HOROVOD, devices.WORKER, devices.PS, devices.ALL_LOCAL):
        assert devices.plan(role, [], []).visible is None
    plan = devices.place(devices.HOROVOD, 0, 2)  # this machine: no GPU, nothing applied
    assert plan.reason == "no GPU: this process runs on the CPU"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_jit_compile_true_under_horovodrun_trains_with_xla_turned_off_and_fails_without():
    script = os.path.join(WORKERS, "jit_user.py")
    out = run_checked(localrun.horovodrun_command(2, [PYTHON, script]), timeout=240)
    results = sorted((json.loads(line.split("RESULT ", 1)[1]) for line in out.stdout.splitlines()
                      if "RESULT " in line), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["turned_off"] and r["jit_compile"] is False
        assert r["devices"] == "no GPU: this process runs on the CPU"
        assert r["loss"][-1] < r["loss"][0]
    assert "jit_compile turned off" in out.stdout + out.stderr
    # The guard is what makes it train: without it the step does not compile.
    bare = localrun.run(localrun.horovodrun_command(2, [PYTHON, script, "--keep_xla"]), timeout=240,
                        env=clean_env(), cwd=REPO)
    assert bare.returncode != 0 and "RESULT " not in bare.stdout
    assert "OpKernel for XLA" in bare.stdout + bare.stderr
