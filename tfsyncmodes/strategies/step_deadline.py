"""A deadline for each train step of an elastic rank: a rank whose step outlives it starts again.

A lost peer can leave a rank's step waiting for ever. Horovod 0.28.1 checks for its shutdown
before it queues a collective and queues it after; a background loop that ends on the lost
peer in between empties the queue first, and the collective stays there, never done and never
failed (``EnqueueTensorAllreduce``), so the rank never reaches the rendezvous where the others
wait (seen in about one chaos run in four and once in CI: the survivors at ``hvd.init``, one rank
in its train function for minutes). The Horovod that ``scripts/install.sh`` builds carries a patch
that closes this race (``scripts/horovod-0.28.1.patch``); the deadline stays for a Horovod built
without it and for any other step that never ends.

:class:`StepDeadline` then starts the rank again in place, as torchrun restarts a worker: one
line on stderr, and the process replaces itself with a new run of the same command (``exec``,
same pid, same streams). Horovod's driver sees no exit. Before the exec the rank asks the
driver for its place in the next world, as Horovod's own reset does (``GET
/rank_and_size/HOST:LOCAL_RANK`` at the rendezvous; this completes the driver's count of the old
world, and the answer comes when the new world is made), and hands it to the new run in
``HOROVOD_RANK``, ``HOROVOD_SIZE`` and the rest, where a new process's ``hvd.init`` reads it;
the new run then receives the last commit from rank 0 as a joining rank does. Ending the rank
instead (status 1) has the driver blacklist its host, and where the survivors are then fewer
than ``--min-np`` the job hung: the driver waited for the host's cooldown, then counted it as
still running and started no process on it.
After :data:`MAX_RESTARTS` restarts of one rank (counted in ``TFSYNC_STEP_DEADLINE_RESTARTS``,
which the new run inherits) the rank ends with status 1 as before.

A step is timed from ``on_train_batch_begin`` to the end of the callbacks after it (put this
callback last: a commit's collectives are in the step's time). The first steps of each ``fit``
are not timed (they trace the train function). The watch is a daemon thread: a step waits in
TensorFlow's runtime without the GIL, so the thread runs.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import urllib.request
from typing import Dict, Optional

from tfsyncmodes.keras.compat import keras

UNTIMED_STEPS = 2  # the first steps of a fit trace the train function
POLL_S = 0.5
MAX_RESTARTS = 3
RESTARTS_ENV = "TFSYNC_STEP_DEADLINE_RESTARTS"
PLACE_VARS = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
              "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")
PLACE_TIMEOUT_S = 600.0  # Horovod's elastic timeout: the driver answers once the new world is made


def next_place(environ=os.environ) -> Optional[Dict[str, str]]:
    """In an elastic Horovod job: this rank's place in the next world, as ``HOROVOD_*`` values,
    from the driver's rendezvous ({} outside elastic Horovod; None: the driver dropped this
    host's slot from the job)."""
    addr, port = environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"), environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if environ.get("HOROVOD_ELASTIC") != "1" or not addr or not port:
        return {}
    key = f"{environ.get('HOROVOD_HOSTNAME', 'localhost')}:{environ.get('HOROVOD_LOCAL_RANK', '0')}"
    with urllib.request.urlopen(f"http://{addr}:{port}/rank_and_size/{key}", timeout=PLACE_TIMEOUT_S) as reply:
        values = reply.read().decode("ascii").strip().split(",")
    if int(values[0]) < 0:
        return None
    return dict(zip(PLACE_VARS, values))


def _close_on_exec() -> None:
    """Marks every descriptor above the standard streams close-on-exec. Closing them here would
    pull them from under Horovod's threads, still running until the exec (Gloo aborted on its
    epoll descriptor once: ``nfds != -1``)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # closed meanwhile, or the listing's own descriptor


class StepDeadline(keras.callbacks.Callback):
    """Starts this process again in place (one line) when one train step lasts over `seconds`;
    after :data:`MAX_RESTARTS`, ends it with status 1 instead."""

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
                self._expire()

    def _expire(self) -> None:
        done = int(os.environ.get(RESTARTS_ENV, "0") or 0)
        again = done < MAX_RESTARTS
        what = (f"this rank starts again and rejoins (restart {done + 1} of {MAX_RESTARTS})" if again
                else "this rank leaves the job and the others go on without it")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os.write(2, (f"tfsyncmodes: elastic: a train step has waited over {self.seconds:g} s "
                     f"(a peer lost in a collective that never ends); {what}\n").encode())  # unbuffered
        if again:
            try:
                place = next_place()
            except (OSError, ValueError) as error:
                os.write(2, f"tfsyncmodes: elastic: no place in the next world ({error}); this rank leaves\n".encode())
                os._exit(1)
            if place is None:
                os.write(2, b"tfsyncmodes: elastic: Horovod's driver took this rank out of the job\n")
                os._exit(1)
            os.environ.update(place)
            os.environ[RESTARTS_ENV] = str(done + 1)
            _close_on_exec()  # the old run's sockets and files close with the exec
            os.execv(sys.executable, sys.orig_argv)
        os._exit(1)
