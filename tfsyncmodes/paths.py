"""Checks of the paths a user gives, before any model or TensorFlow work starts."""
from __future__ import annotations

import os

from tfsyncmodes.errors import ConfigError


def usable_directory(path: str, source: str, field: str) -> str:
    """`path` as a directory this process can create or write into; ConfigError otherwise."""
    if not path:
        raise ConfigError(source, field, "is empty", "give a directory, e.g. runs/mine")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        what = "is a file" if existing == os.path.abspath(path) else f"is inside {existing}, which is a file"
        raise ConfigError(source, field, f"{path} {what}", "give a directory (or a path where one can be made)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(source, field, f"{existing} is not writable by this process",
                          "give a directory you can write to")
    return path
