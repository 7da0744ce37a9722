"""The methods, each a plug-in over the core (see :mod:`interlayer.methods.base`): the four papers' and the
cross-layer family since them (value residuals, cross-layer attention, DenseFormer, hyper-connections, layer
sharing).

Order matters only where the methods say so: factories are customised in this order, and models finalised in
it (Multi-Pass wraps the encoder before Crossformer ties its layers; layer sharing ties whole layers last).
"""
from . import (cla, conv_branch, crossformer, denseformer, hyper_connections, layer_sharing, lightweight, multipass,
               predictive, value_residual)
from .base import Method

METHODS: tuple[Method, ...] = (lightweight.METHOD, conv_branch.METHOD, predictive.METHOD, value_residual.METHOD,
                               cla.METHOD, denseformer.METHOD, hyper_connections.METHOD, multipass.METHOD,
                               crossformer.METHOD, layer_sharing.METHOD)

__all__ = ["METHODS", "Method"]
