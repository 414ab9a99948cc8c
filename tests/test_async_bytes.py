"""What an async step sends: the model once from the parameter server (the forward pass's
reads) and the gradients once to it, with the exactly-once unit on (the default) or off,
under Keras 3 and tf_keras. Counted in the TCP bytes of a real 2-worker gRPC cluster that the
launcher starts in its loopback-only namespace; the chief's task prints the namespace's
sockets (``ss``) after training, while the ps and worker servers still hold them."""
import json
import re

import pytest

from tests.conftest import PYTHON, REPO, run_checked

pytestmark = pytest.mark.slow
HIDDEN = 256
PARAMETERS = 64 * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * 10 + 10  # the trainer's MLP
TASK = """#!/bin/sh
"$@"; status=$?
case "$TF_CONFIG" in *'"type": "chief"'*) echo "CLUSTER $TF_CONFIG"; ss -tin state established;; esac
exit $status
"""


def sent_from(output: str, port: int) -> int:
    """Bytes sent by the sockets whose local port is `port` (``ss -tin`` lines as the launcher
    prefixes them: an address line, then its counters)."""
    total, local = 0, None
    for line in output.splitlines():
        line = re.sub(r"^\[[a-z]+:\d+\] ", "", line)
        address = re.match(r"\s*\d+\s+\d+\s+\S+:(\d+)\s+\S+:\d+", line)
        if address:
            local = int(address.group(1))
            continue
        counted = re.search(r"bytes_sent:(\d+)", line)
        if counted and local == port:
            total += int(counted.group(1))
    return total


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
@pytest.mark.parametrize("exactly_once", [True, False])
def test_an_async_step_moves_the_model_once_each_way(tmp_path, legacy, exactly_once):
    task = tmp_path / "task.sh"
    task.write_text(TASK)
    task.chmod(0o755)
    metrics = tmp_path / "metrics.json"
    result = run_checked(
        [PYTHON, "-m", "tfsyncmodes.launch", "--workers", "2", "--ps", "1", "--", str(task), PYTHON,
         f"{REPO}/scripts/train.py", "--sync_mode=async", "--epochs=2", "--batch_size=32",
         f"--hidden_units={HIDDEN}", f"--model_dir={tmp_path / 'run'}", f"--metrics_file={metrics}",
         f"--sync_exactly_once={str(exactly_once).lower()}"],
        timeout=300, **({"TF_USE_LEGACY_KERAS": "1"} if legacy else {}))
    output = result.stdout + result.stderr
    cluster = json.loads(re.search(r"CLUSTER (\{.*\})", output).group(1))["cluster"]
    port = lambda address: int(address.rsplit(":", 1)[1])  # noqa: E731
    steps = json.loads(metrics.read_text())["steps"]
    model = PARAMETERS * 4
    pulled = sent_from(output, port(cluster["ps"][0])) / steps  # to the workers (and the chief)
    pushed = sum(sent_from(output, port(w)) for w in cluster["worker"]) / steps  # fetched by the ps
    # Each way: the model's float32 bytes, plus gRPC's framing and the step's small tensors.
    assert 0.95 * model < pulled < 1.15 * model, (pulled / model, steps)
    assert 0.95 * model < pushed < 1.15 * model, (pushed / model, steps)
