"""Imports TensorFlow without its C++ start-up lines (oneDNN, CPU features, absl's "before
InitializeLog" warning), which every rank prints and which ``TF_CPP_MIN_LOG_LEVEL`` no longer
silences in TensorFlow 2.21: stderr is held while TensorFlow loads and everything else it
wrote is passed on. A user who sets ``TF_CPP_MIN_LOG_LEVEL`` gets TensorFlow's own behaviour.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile

NOISE = re.compile(r"^(I\d{4} |WARNING: All log messages before absl::InitializeLog|To enable the following "
                   r"instructions:)")


def import_tensorflow_quietly() -> None:
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ or "tensorflow" in sys.modules:
        import tensorflow  # noqa: F401
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"  # and for the processes this one starts
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().decode("utf-8", "replace").splitlines():
                if not NOISE.match(line):
                    print(line, file=sys.stderr)
