"""The local launcher's console command, ``tfsyncmodes-launch`` (or ``python -m
tfsyncmodes_launch``), started without TensorFlow.

A console command's entry point is imported as any module is, and ``import tfsyncmodes.launch``
runs the package's ``__init__`` first, which imports TensorFlow (seconds, and its start-up lines)
in a process that only starts and watches others (``python -m tfsyncmodes.launch`` is the one
form the ``__init__`` recognises and spares). This module
finds ``tfsyncmodes/launch.py`` without importing the package and runs it as a file, as the
launcher runs itself everywhere else (it and the modules it loads import nothing from the
package). A module of its own, like :mod:`tfsyncmodes_warm`, for the same reason.
"""
from __future__ import annotations

import importlib.util
import os
import runpy
import sys


def launcher_path() -> str:
    """``tfsyncmodes/launch.py`` of the installed package (found, not imported)."""
    spec = importlib.util.find_spec("tfsyncmodes")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("tfsyncmodes-launch: the tfsyncmodes package is not installed in this Python")
    return os.path.join(list(spec.submodule_search_locations)[0], "launch.py")


def main() -> None:
    path = launcher_path()
    sys.argv[0] = path
    runpy.run_path(path, run_name="__main__")  # its last line exits with the launcher's status


if __name__ == "__main__":
    main()
