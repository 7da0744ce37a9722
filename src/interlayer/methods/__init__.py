"""The four papers' methods, each a plug-in over the core (see :mod:`interlayer.methods.base`).

Order matters only where the methods say so: factories are customised in this order, and models finalised in
it (Multi-Pass wraps the encoder before Crossformer ties its layers, which is the same either way).
"""
from . import conv_branch, crossformer, lightweight, multipass, predictive
from . import denseformer, hyper_connections
from .base import Method

METHODS: tuple[Method, ...] = (lightweight.METHOD, conv_branch.METHOD, predictive.METHOD, multipass.METHOD,
                               crossformer.METHOD, denseformer.METHOD, hyper_connections.METHOD)

__all__ = ["METHODS", "Method"]
