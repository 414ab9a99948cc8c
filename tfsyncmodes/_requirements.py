"""TensorFlow is a requirement that the ``cpu`` or ``gpu`` extra satisfies (see setup.py); a
process without it gets one line saying what to install instead of an error from deep inside
Keras. Imported first by ``tfsyncmodes/__init__.py``; importing this module runs the check.
"""
from __future__ import annotations

import importlib.util

SUPPORTED = "2.21"
INSTALL_HINT = (
    "install TensorFlow " + SUPPORTED + " with one of: "
    "pip install 'tfsyncmodes[cpu]' (tensorflow-cpu), "
    "pip install 'tfsyncmodes[gpu]' (tensorflow, for GPUs), "
    "or bash scripts/install.sh in a checkout (CPU; TFSYNC_TENSORFLOW=gpu for the GPU build)")


class MissingRequirement(ImportError):
    """A package tfsyncmodes needs is not installed; the message says how to install it."""


def check_tensorflow() -> None:
    """Raises :class:`MissingRequirement` when no TensorFlow build is importable."""
    if importlib.util.find_spec("tensorflow") is None:
        raise MissingRequirement(f"tfsyncmodes needs TensorFlow, which is not installed: {INSTALL_HINT}")


check_tensorflow()
