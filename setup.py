"""Packaging for tfsyncmodes.

Horovod is an extra because PyPI has only its sdist and it must be built against the
installed TensorFlow; ``scripts/install.sh`` does that build (with the one patch TF 2.21
needs) before it installs this package with the ``horovod`` extra.
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
    packages=find_packages(include=["tfsyncmodes", "tfsyncmodes.*"]),
    package_data={"tfsyncmodes": ["py.typed"]},
    python_requires=">=3.10",
    install_requires=[
        # GPU users: install `tensorflow==2.21.*` instead (see README).
        "tensorflow-cpu==2.21.*",
        "numpy",
        "absl-py",
        "PyYAML",
        "tensorboard",
        "scikit-learn",
    ],
    extras_require={
        "horovod": ["horovod==0.28.1"],
        "tfkeras": ["tf-keras==2.21.*"],
        "test": ["pytest", "pytest-timeout", "psutil"],
        "bench": ["matplotlib", "psutil"],
    },
)
