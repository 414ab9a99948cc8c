"""The example trainer (:mod:`tfsyncmodes.examples.train`, installed as ``tfsyncmodes-train``),
run from a checkout without TensorFlow's C++ start-up lines.

    python scripts/train.py                                   # sync, one process
    horovodrun -np 4 python scripts/train.py --sync_mode=sync # sync, Horovod allreduce
    TF_CONFIG=... python scripts/train.py                     # sync, MultiWorkerMirrored
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts.quietstart import import_tensorflow_quietly  # noqa: E402

import_tensorflow_quietly()  # TensorFlow's C++ start-up lines, unless TF_CPP_MIN_LOG_LEVEL is set

from tfsyncmodes.examples.train import main  # noqa: E402

if __name__ == "__main__":
    main()
