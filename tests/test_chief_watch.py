"""How an async worker or ps task tells that its chief is gone (ChiefWatch), probing real
sockets on 127.0.0.1: a refusal after an answer ends the task at once; probes that go
unanswered (here a listener whose accept queue is full, so the kernel drops the connection's
first packet, as a saturated link can delay it) end it only after SILENT_SECONDS of them."""
import socket
import threading
import types

import pytest

from tfsyncmodes.strategies.parameter_server import AsyncStrategy, ChiefWatch, probe


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def listener(backlog=8):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(backlog)
    return server, "127.0.0.1:%d" % server.getsockname()[1]


def test_a_chief_that_answered_and_then_refuses_is_gone():
    server, address = listener()
    watch = ChiefWatch(address, silent=30.0, clock=Clock())
    assert not watch.gone() and watch.seen
    server.close()
    assert probe(address) is False
    assert watch.gone()


def test_a_chief_not_yet_started_is_not_gone():
    server, address = listener()
    server.close()  # the port refuses: nothing listens yet
    watch = ChiefWatch(address, silent=0.0, clock=Clock())
    assert not watch.gone() and not watch.seen


def test_unanswered_probes_end_the_task_only_after_the_silent_time():
    server, address = listener(backlog=0)
    clock = Clock()
    watch = ChiefWatch(address, silent=30.0, clock=clock)
    assert not watch.gone(timeout=0.5) and watch.seen
    held = []
    try:
        while True:  # fill the accept queue until a connection gets no answer
            client = socket.socket()
            client.settimeout(0.3)
            try:
                client.connect(("127.0.0.1", int(address.rsplit(":", 1)[1])))
            except OSError:
                client.close()
                break
            held.append(client)
            if len(held) > 64:
                pytest.fail("the accept queue never filled")
        assert probe(address, timeout=0.3) is None
        for now in (0.0, 10.0, 29.9):
            clock.now = now
            assert not watch.gone(timeout=0.3), now
        clock.now = 30.0
        assert watch.gone(timeout=0.3)
    finally:
        for client in held:
            client.close()
        server.close()


def test_a_lost_ps_whose_listener_closes_a_moment_after_the_error_is_still_named():
    """A killed ps's connections can break (the chief's error) just before its listening socket
    closes; the report probes until it does, and names the ps that went."""
    kept, kept_address = listener()
    going, going_address = listener()
    timer = threading.Timer(0.5, going.close)
    timer.start()
    try:
        owner = types.SimpleNamespace(cluster=types.SimpleNamespace(cluster={"ps": [kept_address, going_address]}))
        failure = AsyncStrategy.parameter_server_lost(owner, RuntimeError("lost"))
    finally:
        timer.join()
        kept.close()
    assert str(failure).startswith(f"ps:1 at {going_address} is unreachable"), str(failure)
    assert "ps:0" not in str(failure)
