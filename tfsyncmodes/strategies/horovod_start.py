"""Starting Horovod over Gloo with the right timeout for each wait.

Gloo has one timeout (``HOROVOD_GLOO_TIMEOUT_SECONDS``, read at every ``hvd.init``) for two
different waits:

- at the rendezvous, for every rank of the world to arrive. In an elastic job a rank that joins
  is a new process, still importing TensorFlow when the others get there (8 s on a quiet
  2-core machine, more on a loaded one); a timeout below that fails the join and stops the job;
- in a collective, for a peer's data. When a rank is lost, only the ranks it was connected to
  in that collective fail at once: the others' wait does not end on a peer's failure, only at
  the timeout (measured on 4 ranks at 30 s: one of the three left failed at once, the other two
  after exactly 30 s). So a lost rank costs the elastic job the whole timeout.

In an elastic job, the knob ``elastic_join_timeout`` is the first and ``collective_timeout`` the
second: when the join timeout is the longer, Horovod starts at it, is shut down once every rank
is there, and starts again at the collective timeout (a second rendezvous of ranks that are all
up: well under a second). Otherwise, and outside elastic jobs, Horovod starts once at the
collective timeout. A ``HOROVOD_GLOO_TIMEOUT_SECONDS`` the user set (e.g. ``horovodrun
--gloo-timeout-seconds``) other than the collective timeout is kept for both waits.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

GLOO_TIMEOUT = "HOROVOD_GLOO_TIMEOUT_SECONDS"


def gloo_timeouts(config) -> Optional[Tuple[int, int]]:
    """Sets Gloo's timeout to the collective timeout unless the environment sets it; returns
    (join, collective) seconds when Horovod is to start twice (module doc), else None."""
    collective = int(config.collective_timeout)
    given = os.environ.setdefault(GLOO_TIMEOUT, str(collective))
    join = int(config.elastic_join_timeout)
    if given != str(collective) or not config.elastic or join <= collective:
        return None
    return join, collective


def start(hvd, timeouts: Optional[Tuple[int, int]], **init_kwargs) -> None:
    """``hvd.init(**init_kwargs)``; with `timeouts` (join, collective): first at the join
    timeout, then shut down and started again at the collective timeout."""
    if timeouts is None:
        hvd.init(**init_kwargs)
        return
    join, collective = timeouts
    os.environ[GLOO_TIMEOUT] = str(join)
    hvd.init(**init_kwargs)
    hvd.shutdown()
    os.environ[GLOO_TIMEOUT] = str(collective)
    hvd.init(**init_kwargs)
