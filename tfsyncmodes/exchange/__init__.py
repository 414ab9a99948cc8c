"""Gradient exchange: the parts each mode chains (see :mod:`tfsyncmodes.exchange.base`)."""
from tfsyncmodes.exchange.base import Chain, Exchange, Part

__all__ = ["Chain", "Exchange", "Part"]
