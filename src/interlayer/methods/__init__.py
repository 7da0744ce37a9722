"""The four papers' methods, each a plug-in over the core (see :mod:`interlayer.methods.base`).

Order matters only where the methods say so: factories are customised in this order, and models finalised in
it (Multi-Pass wraps the encoder before Crossformer ties its layers; layer sharing ties whole layers last).
"""
from . import conv_branch, crossformer, lightweight, multipass, predictive
from . import layer_sharing
from .base import Method

METHODS: tuple[Method, ...] = (lightweight.METHOD, conv_branch.METHOD, predictive.METHOD, multipass.METHOD,
                               crossformer.METHOD, layer_sharing.METHOD)

__all__ = ["METHODS", "Method"]
