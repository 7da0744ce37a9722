"""The register tiles a kernel and its dispatch agree on, in a module of their own: the dispatch (which runs
without Triton) checks a case against them, the Triton module compiles with them, and neither imports the other."""
from __future__ import annotations

# Predictive Attention: the heads a program carries as the CNN's channels (the rows of its tensor-core products,
# padded with zero weights); more heads would need wider tiles than the register file holds at the kernels' row width
PA_CHANNELS = 16


def hc_tile_shape(n: int, d: int) -> tuple[int, int, int]:
    """Hyper-connections: ``(NP, NK, BLOCK_D)``, the kernels' register tiles for ``n`` streams, ``n + 2`` coefficient
    columns and ``d`` channels, each rounded up to a power of two (``NP >= 2``, ``BLOCK_D >= 16``)."""
    def pow2(x: int) -> int:
        return 1 << max(0, (x - 1).bit_length())
    return max(2, pow2(n)), pow2(n + 2), max(16, pow2(d))
