"""Packaging: TensorFlow comes from the cpu or gpu extra, and its absence is one clear error."""
import ast
import os
import subprocess

import pytest

from tests.conftest import PYTHON, REPO, clean_env

# Hides TensorFlow from this interpreter, as on a machine where neither build is installed:
# import and importlib.util.find_spec both treat a None entry in sys.modules as "not there".
WITHOUT_TENSORFLOW = "import sys\nsys.modules['tensorflow'] = None\n"


def setup_call():
    """The keyword arguments of setup.py's setup(...) call, read without running it."""
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "setup")
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords
            if kw.arg in ("install_requires", "extras_require")}


def test_tensorflow_comes_from_an_extra_and_scikit_learn_from_examples():
    setup = setup_call()
    assert not any(r.startswith(("tensorflow", "scikit-learn")) for r in setup["install_requires"])
    extras = setup["extras_require"]
    assert extras["cpu"] == ["tensorflow-cpu==2.21.*"] and extras["gpu"] == ["tensorflow==2.21.*"]
    assert "scikit-learn" in extras["examples"]
    with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as handle:
        text = handle.read()
    assert "[build-system]" in text and 'build-backend = "setuptools.build_meta"' in text


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
