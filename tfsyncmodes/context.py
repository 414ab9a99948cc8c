"""Which strategy's scope this thread is in: the one piece of process state the wrapper reads.

Like ``tf.distribute.get_strategy()``: :meth:`ModeStrategy.scope()
<tfsyncmodes.strategies.base.ModeStrategy.scope>` pushes its strategy for the ``with`` block
(:func:`entered`), and ``tfsyncmodes.wrap`` or a model loaded inside the block builds its
exchange from that strategy (:func:`current`). Outside every scope there is no current
strategy: nothing remembers "the strategy made last". The stack holds any object with the
strategy's public surface (``config``, ``mode``, ``groups``, ``wrap``); this module imports
nothing of the package, so every floor may use it.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional

_scopes = threading.local()  # per thread, like tf.distribute's scope stack


def _stack() -> list:
    return _scopes.__dict__.setdefault("stack", [])


def current() -> Optional[object]:
    """The strategy whose scope this thread is in (the innermost), or None outside every scope."""
    stack = _stack()
    return stack[-1] if stack else None


@contextlib.contextmanager
def entered(strategy) -> Iterator[object]:
    """Makes `strategy` the current one for the ``with`` block (nesting allowed)."""
    stack = _stack()
    stack.append(strategy)
    try:
        yield strategy
    finally:
        stack.pop()
