"""The documentation: the README's links, flags and Python code, the generated knob reference,
and the MkDocs site, which builds with ``--strict`` (every page in the nav, every link and
anchor resolved, the API reference generated from the docstrings)."""
import json
import os
import re
import subprocess

import pytest

from tests.conftest import COLD_PYTHON, PYTHON, REPO, clean_env
from tfsyncmodes import config_files, knobs

README = os.path.join(REPO, "README.md")
KNOB_PAGE = os.path.join(REPO, "docs", "configuration", "knobs.md")


def _readme() -> str:
    with open(README, encoding="utf-8") as handle:
        return handle.read()


def _slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[-\s]+", "-", text).strip("-")


def test_knob_reference_is_the_knob_table():
    """docs/configuration/knobs.md is what config_files.render_reference() renders from KNOBS
    (regenerate with python -m tfsyncmodes.config_files configs docs/configuration/knobs.md)."""
    with open(KNOB_PAGE, encoding="utf-8") as handle:
        assert handle.read() == config_files.render_reference(), f"{KNOB_PAGE} drifted from the knob table"
    page = config_files.render_reference()
    for knob in knobs.KNOBS:
        assert f"## `{knob.key}`" in page and f"`--{knob.flag}`" in page and f"`{knob.env}`" in page


def test_testing_page_names_every_knob():
    """docs/TESTING.md names every knob's --sync_ flag (in the row of the promise that knob serves,
    or in its tolerance), so that a new knob shows up there with the test that proves it."""
    with open(os.path.join(REPO, "docs", "TESTING.md"), encoding="utf-8") as handle:
        page = handle.read()
    missing = [knob.flag for knob in knobs.KNOBS if not re.search(rf"`--{knob.flag}[`=]", page)]
    assert not missing, f"docs/TESTING.md does not name --{', --'.join(missing)}"


def test_readme_links_to_pages_that_exist():
    links = re.findall(r"\]\(([^)\s]+)\)", _readme())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        full = os.path.join(REPO, path)
        assert os.path.isfile(full), f"README links to {path}, which does not exist"
        if anchor:
            with open(full, encoding="utf-8") as handle:
                slugs = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", handle.read(), re.M)}
            assert anchor in slugs, f"README links to {link}: no such heading in {path}"


def test_readme_sync_flags_are_knob_flags():
    named = set(re.findall(r"--(sync_\w+)", _readme()))
    real = {knob.flag for knob in knobs.KNOBS} | {"sync_config"}
    assert named, "the README names no --sync_ flag"
    assert named <= real, f"the README names flags that are not knobs: {sorted(named - real)}"


def test_readme_python_code_runs(tmp_path):
    """Every ```python block of the README, as written, trains (one process: MirroredStrategy)."""
    blocks = re.findall(r"```python\n(.*?)```", _readme(), re.S)
    assert blocks, "the README has no Python code"
    for number, block in enumerate(blocks):
        script = tmp_path / f"readme_{number}.py"
        script.write_text(block)
        result = subprocess.run([PYTHON, str(script)], cwd=tmp_path, env=clean_env(TF_CPP_MIN_LOG_LEVEL="2"),
                                capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, f"README block {number} failed:\n{result.stderr[-3000:]}"


def test_mkdocs_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings")
    env = clean_env(NO_MKDOCS_2_WARNING="1")
    result = subprocess.run([PYTHON, "-m", "mkdocs", "build", "--strict", "-f", os.path.join(REPO, "mkdocs.yml"),
                             "-d", str(tmp_path / "site")], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "site" / "configuration" / "knobs" / "index.html").is_file()
    assert "make_strategy" in (tmp_path / "site" / "api" / "index.html").read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["sync", "hybrid", "async"])
def test_the_readme_snippet_unchanged_trains_in_every_mode(tmp_path, mode):
    """One flag is enough: the README's script, as written (it compiles Adam), under horovodrun
    (sync, hybrid) and under the launcher (async: chief, 2 workers, 1 ps)."""
    from tfsync_testbed import localrun

    block = re.findall(r"```python\n(.*?)```", _readme(), re.S)[0]
    script = tmp_path / "user_script.py"
    script.write_text(block)
    flag = f"--sync_mode={mode}"
    if mode == "async":
        command = [PYTHON, "-m", "tfsyncmodes.launch", "--workers", "2", "--ps", "1", "--timeout", "600", "--",
                   PYTHON, str(script), flag]
    else:
        command = localrun.horovodrun_command(2, [PYTHON, str(script), flag] + (
            ["--sync_group_size=1"] if mode == "hybrid" else []))
    result = localrun.run(command, timeout=700, env=clean_env(), cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "Traceback" not in result.stdout + result.stderr
    # The chief wrote its checkpoint and TensorBoard log under the script's model_dir.
    assert (tmp_path / "runs" / "mine" / "checkpoint.weights.h5").is_file()
    assert (tmp_path / "runs" / "mine" / "logs").is_dir()


def _readme_commands(heading: str):
    """The commands of the ```sh block under the README's `heading`, one list of words each."""
    import shlex

    section = _readme().split(f"## {heading}\n", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


README_MODES = ["sync", "async", "hybrid", "auto"]
PYTHON_WORDS = {".venv/bin/python"}  # the launcher: .venv/bin/tfsyncmodes-launch


def test_the_readme_gives_one_command_per_mode_with_the_checkouts_python():
    commands = _readme_commands("One command per mode, on one host")
    modes = [next(w for w in c if w.startswith("--sync_mode=")).split("=")[1] for c in commands]
    assert modes == README_MODES, modes
    assert {w for c in commands for w in c if w.endswith("python")} == PYTHON_WORDS


@pytest.mark.slow
@pytest.mark.timeout(500)
@pytest.mark.parametrize("mode", README_MODES)
def test_the_readme_command_of_each_mode_trains_as_written(tmp_path, mode):
    """The command of "One command per mode" for `mode`, as written, from the checkout (its
    `.venv/` and `python` first on PATH, as after `source .venv/bin/activate`), for one epoch.
    When the tests run with that `.venv`'s interpreter, its `python` and `horovodrun` run under
    the warm one (the same interpreter with TensorFlow, Keras and Horovod imported once:
    tests/conftest.py). The `.venv`'s interpreter started cold trains in test_packaging.py
    (`tfsyncmodes-train`)."""
    from tfsync_testbed import localrun

    command = _readme_commands("One command per mode, on one host")[README_MODES.index(mode)]
    assert f"--sync_mode={mode}" in command, command
    venv_bin = os.path.join(REPO, ".venv", "bin")
    assert os.path.isfile(os.path.join(venv_bin, "horovodrun")), "the README's commands need scripts/install.sh's .venv"
    if os.path.abspath(COLD_PYTHON) == os.path.join(venv_bin, "python"):
        # Horovod's launcher too: `horovodrun` is `python -m horovod.runner.launch`.
        warm = {".venv/bin/horovodrun": localrun.horovodrun(PYTHON), **{w: [PYTHON] for w in PYTHON_WORDS}}
        command = [v for w in command for v in warm.get(w, [w])]
    env = clean_env(PATH=venv_bin + os.pathsep + os.environ.get("PATH", ""))
    metrics = tmp_path / f"{mode}.json"
    result = localrun.run(command + ["--epochs=1", f"--model_dir={tmp_path / mode}", f"--metrics_file={metrics}"],
                          timeout=400, env=env, cwd=REPO)
    assert result.returncode == 0, f"{command}:\n" + result.stdout[-3000:] + result.stderr[-3000:]
    got = json.loads(metrics.read_text())
    assert got["mode"] in ({"auto": ("sync", "hybrid")}.get(mode) or (mode,)), got
    # One epoch: sync and hybrid reach about 0.9 on digits, async's SGD 0.45-0.9; ten classes.
    assert got["epochs_run"] == [0] and got["test_accuracy"] > 0.3, got
