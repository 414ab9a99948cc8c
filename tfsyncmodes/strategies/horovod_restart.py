"""Restarting Horovod inside a running ``horovodrun`` job that is not elastic, every rank at once.

``hvd.shutdown()`` and ``hvd.init(...)`` again need a rendezvous store free of the last start's
addresses. horovodrun's own store (Horovod 0.28.1) clears a scope only once every rank of it has
finished with it, and clearing one scope forgets the finishes counted for the others, so the
local and cross scopes can keep the last start's addresses: a rank that starts again reads a
peer's old port and Gloo aborts the process (``connect [...]: Connection refused``; on the
emulated cluster bed two policy runs in about eighteen). So restarts rendezvous at a store of their
own: Horovod's ``RendezvousHTTPServer``, served by rank 0 on the address its host name has (a
loopback address when the job runs on one host) and cleared by rank 0 before every restart. The
ranks learn its address in a broadcast from rank 0, which none gets before the clear, so no rank
starts again before it.
"""
from __future__ import annotations

import os
import socket
import threading
from typing import Optional, Sequence

from tfsyncmodes.strategies import horovod_start

ADDR, PORT = "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"


class Restarts:
    """Restarts of one process's Horovod (see the module doc); rank 0 serves the store."""

    def __init__(self, hvd):
        self.hvd = hvd
        self._server = None

    def _serve(self) -> str:
        """Rank 0: the store cleared (started the first time); returns its "address:port"."""
        if self._server is None:
            from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

            address = socket.gethostbyname(os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname())
            self._server = RendezvousHTTPServer((address, 0), RendezvousHandler, 0)
            threading.Thread(target=self._server.serve_forever, name="tfsync-rendezvous", daemon=True).start()
        self._server.init([])  # no scope sizes: each key goes when its rank has finished with it
        address, port = self._server.server_address[:2]
        return f"{address}:{port}"

    def restart(self, timeouts, process_sets: Sequence[Sequence[int]]) -> None:
        """Horovod shut down and started again with exactly `process_sets` (rank lists), every
        rank at the same point; `timeouts`: as :func:`horovod_start.start` takes them."""
        hvd = self.hvd
        where: Optional[str] = self._serve() if hvd.rank() == 0 else None
        where = hvd.broadcast_object(where, root_rank=0, name="tfsync.restart")
        address, port = where.rsplit(":", 1)
        hvd.shutdown()
        os.environ[ADDR], os.environ[PORT] = address, port
        horovod_start.start(hvd, timeouts, process_sets=[hvd.ProcessSet(list(ranks)) for ranks in process_sets])
