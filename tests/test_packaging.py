"""Packaging: TensorFlow comes from the cpu or gpu extra, and its absence is one clear error; the
installed package is the library only (no test bed, no benchmarks) and imports none of them."""
import ast
import os
import subprocess
import tomllib

import pytest

from tests.conftest import COLD_PYTHON, PYTHON, REPO, clean_env

# Hides TensorFlow from this interpreter, as on a machine where neither build is installed:
# import and importlib.util.find_spec both treat a None entry in sys.modules as "not there".
WITHOUT_TENSORFLOW = "import sys\nsys.modules['tensorflow'] = None\n"


def pyproject():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as handle:
        return tomllib.load(handle)


def test_tensorflow_comes_from_an_extra_and_scikit_learn_from_examples():
    project = pyproject()["project"]
    assert not any(r.startswith(("tensorflow", "scikit-learn")) for r in project["dependencies"])
    extras = project["optional-dependencies"]
    assert extras["cpu"] == ["tensorflow-cpu==2.21.*"] and extras["gpu"] == ["tensorflow==2.21.*"]
    assert "scikit-learn" in extras["examples"]
    assert pyproject()["build-system"]["build-backend"] == "setuptools.build_meta"


def test_one_version_read_by_the_package_and_the_metadata():
    """The version is written once (tfsyncmodes/__init__.py); the metadata reads it from there,
    statically, and the installed distribution reports the same."""
    import importlib.metadata

    import tfsyncmodes

    assert pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tfsyncmodes.__version__"}
    assert "version" not in pyproject()["project"] and "version" in pyproject()["project"]["dynamic"]
    assert importlib.metadata.version("tfsyncmodes") == tfsyncmodes.__version__
    assert not os.path.exists(os.path.join(REPO, "setup.py"))


@pytest.mark.timeout(60)
def test_missing_tensorflow_is_one_clear_import_error():
    code = (WITHOUT_TENSORFLOW + "import runpy\n"
            + f"runpy.run_path({os.path.join(REPO, 'tfsyncmodes', '_requirements.py')!r})\n")
    result = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=50,
                            env=clean_env(), cwd=REPO)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert "MissingRequirement: " in last, result.stderr
    assert "tfsyncmodes needs TensorFlow, which is not installed" in last
    assert "'tfsyncmodes[cpu]'" in last and "'tfsyncmodes[gpu]'" in last


@pytest.mark.timeout(60)
def test_the_check_passes_where_tensorflow_is_installed():
    result = subprocess.run([PYTHON, os.path.join(REPO, "tfsyncmodes", "_requirements.py")],
                            capture_output=True, text=True, timeout=50, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr


# --- the installed package is the library only -------------------------------------------
SUPPORT = ("tests", "tfsync_testbed", "benchmarks", "scripts")  # the checkout's, never installed
SUPPORT_MODULES = ("netns", "ssh", "sshd", "localrun", "throttle", "testbed", "conftest")


def installed_packages():
    """The packages pyproject.toml's ``[tool.setuptools.packages.find]`` names, evaluated on this
    checkout."""
    from setuptools import find_packages

    return find_packages(REPO, **pyproject()["tool"]["setuptools"]["packages"]["find"])


def installed_modules():
    """(dotted name, path) of every module file in the installed packages."""
    for package in installed_packages():
        directory = os.path.join(REPO, *package.split("."))
        for name in sorted(os.listdir(directory)):
            if name.endswith(".py"):
                yield f"{package}.{name[:-3]}", os.path.join(directory, name)


def imported_names(path):
    """Every module `path` imports by name (import, from-import, importlib.import_module("..."))."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", ""))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
            yield str(node.args[0].value)


def test_the_package_installs_no_test_or_benchmark_support():
    packages = installed_packages()
    assert "tfsyncmodes" in packages and all(p.split(".")[0] == "tfsyncmodes" for p in packages), packages
    modules = dict(installed_modules())
    assert "tfsyncmodes.faults" in modules  # fault injection is a feature of the package
    support = [name for name in modules if any(part in SUPPORT_MODULES or part.startswith(("test", "bench"))
                                               for part in name.split(".")[1:])]
    assert not support, f"test or benchmark support would be installed: {support}"


def test_no_module_of_the_package_imports_test_or_benchmark_support():
    found = [f"{name} imports {imported}" for name, path in installed_modules()
             for imported in imported_names(path) if imported.split(".")[0] in SUPPORT]
    assert not found, found


@pytest.mark.timeout(120)
def test_the_launcher_is_a_console_command():
    scripts = pyproject()["project"]["scripts"]
    assert scripts["tfsyncmodes-launch"] == "tfsyncmodes_launch:main"
    command = os.path.join(os.path.dirname(COLD_PYTHON), "tfsyncmodes-launch")
    result = subprocess.run([command, "--print-tf-config", "--hosts", "a,b", "--workers", "1", "--ps", "1"],
                            capture_output=True, text=True, timeout=100, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert '"task":{"type":"chief","index":0}' in result.stdout


@pytest.mark.timeout(120)
def test_the_launchers_console_command_starts_without_tensorflow():
    # The command's entry point with TensorFlow made unimportable: the package's __init__
    # (which imports it) must not run; a bad option still gives the launcher's one line.
    for args, status, out in ((["--print-tf-config", "--hosts", "a,b", "--workers", "1"], 0,
                               '"task":{"type":"chief","index":0}'),
                              (["--workers", "0", "--", "true"], 2, "launch: --workers: 0 is too few")):
        code = (WITHOUT_TENSORFLOW + f"sys.argv = ['tfsyncmodes-launch', *{args!r}]\n"
                "import tfsyncmodes_launch\ntfsyncmodes_launch.main()\n")
        result = subprocess.run([COLD_PYTHON, "-c", code], capture_output=True, text=True, timeout=100,
                                env=clean_env(), cwd="/")
        assert result.returncode == status, result.stderr
        assert out in result.stdout + result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tool, args, out", [
    ("tfsyncmodes.advise", ["--ranks=8", "--step_ms=50", "--grad_mb=4", "--link_gbit=10"], "highest throughput: "),
    ("tfsyncmodes.launch", ["--print-tf-config", "--hosts", "a,b", "--workers", "1"], '"type":"chief"')])
def test_the_tools_run_with_python_m_import_no_tensorflow(tool, args, out):
    # Python's own record of every module the process imported (-X importtime, on stderr).
    result = subprocess.run([PYTHON, "-X", "importtime", "-m", tool, *args], capture_output=True, text=True,
                            timeout=100, env=clean_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert out in result.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")]
    assert "tfsyncmodes" in imported and len(imported) > 20, result.stderr[-3000:]
    heavy = [name for name in imported if name.split(".")[0] in ("tensorflow", "keras", "tf_keras", "horovod")]
    assert heavy == [], heavy[:10]


@pytest.mark.parametrize("argv, module", [
    (["python", "-m", "tfsyncmodes.advise", "--ranks=8"], "tfsyncmodes.advise"),
    (["python", "-X", "importtime", "-m", "tfsyncmodes.launch", "--", "-m"], "tfsyncmodes.launch"),
    (["python", "-u", "-W", "ignore", "-mtfsyncmodes.advise"], "tfsyncmodes.advise"),
    (["python", "scripts/train.py", "-m", "tfsyncmodes.advise"], ""),
    (["python", "-c", "import tfsyncmodes", "-m", "tfsyncmodes.advise"], ""),
    (["python", "-"], ""),
    (["python"], ""),
    (["python", "-Em", "tfsyncmodes.launch"], "tfsyncmodes.launch"),
    (["python", "-uW", "ignore", "-Bm", "tfsyncmodes.advise"], "tfsyncmodes.advise"),
    (["python", "-uXdev", "-m", "tfsyncmodes.advise"], "tfsyncmodes.advise"),
    (["python", "--check-hash-based-pycs", "always", "-m", "tfsyncmodes.launch"], "tfsyncmodes.launch"),
    (["python", "-cimport tfsyncmodes", "-m", "tfsyncmodes.launch"], ""),
    (["python", "-Ic", "import tfsyncmodes", "-m", "tfsyncmodes.launch"], ""),
    (["python", "--", "-m", "tfsyncmodes.launch"], ""),
    (["python", "script.py", "-m", "tfsyncmodes.launch"], "")])
def test_the_package_reads_which_module_python_m_runs(argv, module):
    import tfsyncmodes

    assert tfsyncmodes._module_run(argv) == module


def test_the_public_names_are_there_and_found_on_first_use():
    # Imported by a test (not a tool): eagerly; a tool's process finds them on first use.
    import tfsyncmodes
    from tfsyncmodes.strategies import make_strategy

    assert all(name in vars(tfsyncmodes) for name in tfsyncmodes.__all__)
    assert set(tfsyncmodes.__all__) <= set(dir(tfsyncmodes))
    assert tfsyncmodes.__getattr__("make_strategy") is make_strategy
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        tfsyncmodes.__getattr__("nothing")


@pytest.mark.timeout(240)
def test_the_example_trainer_is_a_console_command_that_trains(tmp_path):
    """``tfsyncmodes-train`` (the installed example trainer) trains the digits in one process."""
    import json

    assert pyproject()["project"]["scripts"]["tfsyncmodes-train"] == "tfsyncmodes.examples.train:main"
    command = os.path.join(os.path.dirname(COLD_PYTHON), "tfsyncmodes-train")
    metrics = tmp_path / "metrics.json"
    result = subprocess.run([command, "--epochs=2", f"--model_dir={tmp_path / 'run'}", f"--metrics_file={metrics}"],
                            capture_output=True, text=True, timeout=220, env=clean_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    got = json.loads(metrics.read_text())
    assert (got["mode"], got["epochs_run"], got["steps"]) == ("sync", [0, 1], 2 * got["steps_per_epoch"])
    assert got["test_accuracy"] > 0.85, got
    assert (tmp_path / "run" / "sync" / "model.keras").exists()


def test_the_installed_horovod_is_built_with_the_projects_patch():
    """scripts/install.sh builds Horovod from its sdist with scripts/horovod-0.28.1.patch (the
    queue refuses a collective after its shutdown, fault-tolerance.md): the installed build says
    so in the names the patch adds to ``horovod/__init__.py``; an unpatched wheel from an older
    cache would not."""
    with open(os.path.join(REPO, "scripts", "horovod-0.28.1.patch"), encoding="utf-8") as handle:
        patch = handle.read()
    assert "+tfsyncmodes_patches = ('tensor-queue-finalized',)" in patch
    result = subprocess.run([PYTHON, "-c", "import horovod; print(getattr(horovod, 'tfsyncmodes_patches', ()))"],
                            capture_output=True, text=True, timeout=120, env=clean_env(), cwd=REPO)
    assert result.stdout.strip() == "('tensor-queue-finalized',)", result.stderr[-2000:]
