"""--sync_mode_schedule: parsing (bad text is one line naming the knob) and phases in steps."""
import subprocess
import sys

import pytest

from tfsyncmodes import schedule
from tfsyncmodes.config import resolve
from tfsyncmodes.errors import ConfigError
from tfsyncmodes.schedule import Phase


def test_phases_by_fraction_epochs_and_steps():
    assert schedule.phases("sync:10%,hybrid:80%,sync", 100, 10) == [
        Phase("sync", 0, 10), Phase("hybrid", 10, 90), Phase("sync", 90, 100)]
    assert schedule.phases("sync:2e,async", 50, 10) == [Phase("sync", 0, 20), Phase("async", 20, 50)]
    assert schedule.phases("hybrid:7,sync", 20, 10) == [Phase("hybrid", 0, 7), Phase("sync", 7, 20)]
    # Lengths past the end are cut; a phase with no step left out; steps left over go to the last.
    assert schedule.phases("sync:3e,hybrid:1e,sync", 25, 10) == [Phase("sync", 0, 25)]
    assert schedule.phases("sync:10%,hybrid:50%", 10, 5) == [Phase("sync", 0, 1), Phase("hybrid", 1, 10)]
    phases = schedule.phases("sync:10%,hybrid:80%,sync", 100, 10)
    assert [schedule.mode_at(phases, s) for s in (0, 9, 10, 89, 90, 99)] == \
        ["sync", "sync", "hybrid", "hybrid", "sync", "sync"]
    assert schedule.modes("sync:10%,hybrid:80%,sync") == ("sync", "hybrid")


def test_canonical_text():
    assert schedule.parse(" Sync:10% , hybrid:80.0%,sync ") == "sync:10%,hybrid:80%,sync"
    assert schedule.parse("") == ""


@pytest.mark.parametrize("text, words", [
    ("sync:10%,bogus", "names mode 'bogus'"),
    ("auto:10%,sync", "names mode 'auto'"),
    ("sync,hybrid", "phase 0 of 'sync,hybrid' has no length"),
    ("sync:10x,hybrid", "is not a number"),
    ("sync:60%,hybrid:60%,sync", "add up to 120 %"),
    ("sync:0%,hybrid", "out of range"),
    ("sync", "has one phase"),
    ("sync:5,sync", "two sync phases in a row"),
])
def test_bad_schedules_name_the_knob_and_the_fix(text, words):
    with pytest.raises(ConfigError) as error:
        resolve({"mode_schedule": text}, environ={}, use_flags=False)
    message = str(error.value)
    assert words in message and "mode_schedule" in message


def test_bad_schedule_flag_is_one_line_exit_2():
    from tests.conftest import REPO, clean_env

    env = clean_env()
    env.pop("TF_CPP_MIN_LOG_LEVEL")  # unset, as a user's: the script keeps TensorFlow's start-up lines off
    run = subprocess.run([sys.executable, "scripts/train.py", "--sync_mode_schedule=sync:10%,nope"],
                         capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert run.returncode == 2, run.stderr
    lines = [l for l in run.stderr.splitlines() if l.strip()]
    assert lines == ["tfsyncmodes: error: flag: --sync_mode_schedule: phase 1 of 'sync:10%,nope' names mode "
                     "'nope'; use modes among sync, async, hybrid"], lines
