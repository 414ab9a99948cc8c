"""Packaging for tfsyncmodes.

TensorFlow is a requirement that one of two extras satisfies, so that a CPU machine gets the
small ``tensorflow-cpu`` build and a GPU machine keeps its ``tensorflow`` (both provide the
same ``tensorflow`` module; installing both puts two builds in one place):

    pip install '.[cpu]'     # tensorflow-cpu
    pip install '.[gpu]'     # tensorflow (GPU support on Linux)

Without either, ``import tfsyncmodes`` says which to install (tfsyncmodes/_requirements.py).
Horovod is an extra because PyPI has only its sdist and it must be built against the
installed TensorFlow; ``scripts/install.sh`` does that build (with the one patch TF 2.21
needs) before it installs this package with the ``horovod`` extra. ``examples`` has what
``scripts/train.py`` needs beyond the package (scikit-learn's bundled digits).
"""
from setuptools import find_packages, setup

setup(
    name="tfsyncmodes",
    version="0.1.0",
    description=(
        "Switch TensorFlow/Keras data-parallel training between sync, async and hybrid "
        "replica synchronisation with one flag."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # The library only: tests/, the test bed tfsync_testbed/, benchmarks/ and scripts/ stay in the
    # checkout (tests/test_packaging.py checks what this installs and what it imports).
    packages=find_packages(include=["tfsyncmodes", "tfsyncmodes.*"]),
    package_data={"tfsyncmodes": ["py.typed"]},
    python_requires=">=3.10",
    install_requires=[
        "numpy",
        "absl-py",
        "PyYAML",
        "tensorboard",
    ],
    extras_require={
        "cpu": ["tensorflow-cpu==2.21.*"],
        "gpu": ["tensorflow==2.21.*"],
        "horovod": ["horovod==0.28.1"],
        # tf-keras requires the `tensorflow` distribution; with [cpu], install it with --no-deps
        # (scripts/install.sh does): tensorflow-cpu provides the same module.
        "tfkeras": ["tf-keras==2.21.*"],
        "examples": ["scikit-learn"],
        # matplotlib: the compare_modes smoke test draws the plots.
        "test": ["pytest", "pytest-timeout", "psutil", "scikit-learn", "matplotlib", "import-linter", "grimp"],
        "bench": ["matplotlib", "psutil"],
    },
)
