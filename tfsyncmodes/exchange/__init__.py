"""Gradient exchange: the chain each mode assembles from small parts."""
from tfsyncmodes.exchange.base import Chain, GradientTransform, chain
from tfsyncmodes.exchange.communicators import HorovodAllreduce
from tfsyncmodes.exchange.modes import for_mode

__all__ = ["Chain", "GradientTransform", "HorovodAllreduce", "chain", "for_mode"]
