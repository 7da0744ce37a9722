"""The methods, each a plug-in over the core (see :mod:`interlayer.methods.base`): the four papers' and the
cross-layer family since them (value residuals, cross-layer attention, DenseFormer, hyper-connections and their
manifold-constrained form mHC, MUDDFormer, layer sharing).

Order matters only where the methods say so: factories are customised in this order, and models finalised in
it (Multi-Pass wraps the encoder before Crossformer ties its layers; layer sharing ties whole layers last; CLA
comes after the methods that replace the residual connections, so it sees whether the core's pre-norm is there).
"""
from . import (
    cla,
    conv_branch,
    crossformer,
    denseformer,
    hyper_connections,
    layer_sharing,
    lightweight,
    mhc,
    muddformer,
    multipass,
    predictive,
    value_residual,
)
from .base import Method

METHODS: tuple[Method, ...] = (lightweight.METHOD, conv_branch.METHOD, predictive.METHOD, value_residual.METHOD,
                               denseformer.METHOD, hyper_connections.METHOD, mhc.METHOD, muddformer.METHOD,
                               cla.METHOD, multipass.METHOD, crossformer.METHOD, layer_sharing.METHOD)

__all__ = ["METHODS", "Method"]
