"""Resume after a lost process: rerunning the same command (horovodrun sync or hybrid, or a
MirroredStrategy run) with the same --model_dir continues from the last completed epoch, and
rerunning a finished run trains nothing more. Async resumes after a lost parameter server:
tests/test_async.py."""
import json
import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from tests.conftest import OWNER, OWNER_VAR, PYTHON, REPO, clean_env, run_checked
from tfsyncmodes.testing import localrun

EPOCHS = 8
STEPS_PER_EPOCH = 22  # digits: 1437 training examples // batch 64


def command(model_dir, metrics, extra):
    train = [PYTHON, os.path.join(REPO, "scripts", "train.py"), *extra, f"--epochs={EPOCHS}",
             f"--model_dir={model_dir}", f"--metrics_file={metrics}"]
    return train if "--sync_backend=mirrored" in extra else localrun.horovodrun_command(2, train)


def rank_process(rank):
    for process in psutil.process_iter():
        try:
            env = process.environ()
            if env.get(OWNER_VAR) == OWNER and env.get("HOROVOD_RANK") == str(rank) and "train.py" in " ".join(
                    process.cmdline()):
                return process
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return None


@pytest.mark.slow
@pytest.mark.parametrize("mode, extra", [("sync", []), ("hybrid", ["--group_size=1"]),
                                         ("sync", ["--sync_backend=mirrored"])], ids=["horovod", "hybrid", "mirrored"])
@pytest.mark.timeout(420)
def test_a_rerun_after_a_lost_rank_resumes_from_the_last_completed_epoch(tmp_path, mode, extra):
    extra = [f"--sync_mode={mode}", *extra]
    metadata = tmp_path / mode / "backup" / "training_metadata.json"
    job = subprocess.Popen(command(tmp_path, tmp_path / "first.json", extra), env=clean_env(), cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and job.poll() is None:
            if metadata.exists() and json.loads(metadata.read_text() or "{}").get("epoch", 0) >= 3:
                break
            time.sleep(0.2)
        # One rank of two under horovodrun; the one process of a MirroredStrategy run.
        victim = psutil.Process(job.pid) if "--sync_backend=mirrored" in extra else rank_process(1)
        assert victim is not None and job.poll() is None, "the job ended before it could be killed"
        victim.send_signal(signal.SIGKILL)
        output, _ = job.communicate(timeout=120)
    finally:
        localrun.kill_group(job)
    assert job.returncode != 0
    completed = json.loads(metadata.read_text())["epoch"]  # the chief's last completed epoch
    assert 3 <= completed < EPOCHS
    first_losses = [float(v) for v in re.findall(r"step - .*loss: ([0-9.]+)", output)]
    assert len(first_losses) >= completed - 1  # the last line may die with the job

    run_checked(command(tmp_path, tmp_path / "resumed.json", extra), timeout=240)
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["epochs_run"] == list(range(completed, EPOCHS))  # right after the last completed one
    assert resumed["steps"] == EPOCHS * STEPS_PER_EPOCH  # the optimizer's count came back too
    # The loss goes on from where it was, not from a fresh model's.
    assert resumed["losses"][0] < first_losses[0] / 2
    assert resumed["losses"][0] < 2 * first_losses[-1] + 0.05
    assert resumed["test_accuracy"] > 0.9

    run_checked(command(tmp_path, tmp_path / "again.json", extra), timeout=240)
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["epochs_run"] == [] and again["steps"] == EPOCHS * STEPS_PER_EPOCH  # finished: no restart
