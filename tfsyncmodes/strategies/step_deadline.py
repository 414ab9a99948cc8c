"""A deadline for each train step of an elastic rank: a rank whose step outlives it leaves the job.

In an elastic hybrid job a lost peer can leave a rank's step waiting for ever: Horovod's
background loop ends at the collective timeout ("Timed out waiting ... for send operation"), yet
the step's pending collective never fails, so the rank never reaches the rendezvous where the
others wait (seen in about one chaos run in four: the survivors at ``hvd.init``, one rank in its
train function for minutes; where in Horovod the collective is left pending is not known).
As PyTorch's NCCL watchdog does with a collective that hangs,
:class:`StepDeadline` then ends the process: one line on stderr and exit status 1, which
Horovod's elastic driver counts as a lost rank; the others re-form the world without it, and
the discovery script brings its host back as for any other loss.

A step is timed from ``on_train_batch_begin`` to the end of the callbacks after it (put this
callback last: a commit's collectives are in the step's time). The first steps of each ``fit``
are not timed (they trace the train function). The watch is a daemon thread: a step waits in
TensorFlow's runtime without the GIL, so the thread runs.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Optional

from tfsyncmodes.keras.compat import keras

UNTIMED_STEPS = 2  # the first steps of a fit trace the train function
POLL_S = 0.5


class StepDeadline(keras.callbacks.Callback):
    """Ends this process (status 1, one line) when one train step lasts over `seconds`."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = float(seconds)
        self._started: Optional[float] = None
        self._steps = 0
        self._thread: Optional[threading.Thread] = None

    def on_train_begin(self, logs=None):
        self._steps, self._started = 0, None
        if self._thread is None:  # one watch for the process's life; idle between steps
            self._thread = threading.Thread(target=self._watch, name="tfsync-step-deadline", daemon=True)
            self._thread.start()

    def on_train_batch_begin(self, batch, logs=None):
        self._steps += 1
        if self._steps > UNTIMED_STEPS:
            self._started = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        self._started = None

    def on_train_end(self, logs=None):
        self._started = None

    def idle(self) -> None:
        """No step runs now: call it when ``fit`` ended by an exception (Keras then calls no
        ``on_train_batch_end`` and no ``on_train_end``), before the rank waits elsewhere."""
        self._started = None

    def _watch(self) -> None:
        while True:
            time.sleep(POLL_S)
            started = self._started
            if started is not None and time.monotonic() - started > self.seconds:
                os.write(2, (f"tfsyncmodes: elastic: a train step has waited over {self.seconds:g} s "
                             "(a peer lost in a collective that never ends); this rank leaves the job "
                             "and the others go on without it\n").encode())  # unbuffered
                os._exit(1)
