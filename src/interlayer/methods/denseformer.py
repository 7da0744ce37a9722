"""DenseFormer (Pagliardini, Mohtashami, Fleuret & Jaggi, "DenseFormer: Enhancing Information Flow in Transformers
via Depth Weighted Averaging", NeurIPS 2024, arXiv 2402.02622): after block i, a learned weighted average of the
embeddings and every earlier block's output is what block i+1 reads.

Paper map (arXiv v2 section numbers):

* **DWA** (Sec. 3.1, Fig. 1): ``X_0`` the embedded input, ``X_i = B_i(Y_{i-1})``, ``Y_i = DWA_i(X_0, ..., X_i) =
  sum_j alpha_{i,j} X_j``, the output ``Y_d`` (then the final LayerNorm and the head): :class:`DepthWeightedAverage`,
  the stack's depth connection; scalar weights, one per (DWA, input) pair. The inputs are the raw ``X_j``, never
  earlier ``Y_j`` (Sec. 3.1's definition; the official code's ``DWAModules.forward`` stores ``X_i`` before averaging).
* **Initialisation** (Sec. 3.1): ``alpha_{i,i} = 1``, the rest 0: the plain Transformer, bit for bit (tested).
* **kxp-DenseFormer** (Sec. 3.2): ``dilation`` k, ``period`` p; ``DWA_i`` averages ``{X_j : j <= i, j = i mod k}``
  and exists where ``p`` divides ``i`` (:func:`dwa_inputs`); 1x1 is the plain DenseFormer.
* **Parameters** (Sec. 3.1): the DWAs' input counts summed, ``d (d + 3) / 2`` for 1x1 on d blocks (tested).

Choices where the paper leaves room: **every stack** (the paper's model is a decoder-only LM) gets its own DWA, its
own ``X_0``: a position is averaged only with itself at other depths, so the causal LM stays causal and cached
decoding exact, with nothing cached. **Post-LN** is averaged the same way (the definition needs only blocks ``B_i``),
with no final LayerNorm. With ``p`` not dividing the depth, the last blocks have no DWA and the output is their ``X``
(the definition and the official code). **Multi-Pass** composes: each pass from its own ``X_0`` with the same (tied)
DWA weights, the injector adding after the DWA, ``states`` the ``Y_i``. **Arithmetic**: an element-wise weighted sum
in the stream's dtype, not a matmul (a TF32/bf16 product would round the residual stream at every block and break
the exact identity on a GPU), left out of the MAdds as residual additions are.

Options (the recommended 4x5, the 2x2 variant), costs and what the paper has beyond this: docs/methods/denseformer.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch
from torch import Tensor, nn

from ..core.components import Components, StackSide
from ..core.layers import DepthConnection
from ..errors import ConfigError
from .base import STACK_REFUSAL, ComposedConfig, CompositionExample, MethodBase, NamedVariant, section_variant


@dataclass
class DenseFormerConfig:
    """``dilation`` k and ``period`` p of a kxp-DenseFormer (Sec. 3.2); 1 and 1 is the plain DenseFormer."""

    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset()  # no option sizes a saved tensor (checkpoint.py)

    dilation: int = 1
    period: int = 1

    def validate(self, cfg: ComposedConfig) -> None:
        for key in ("dilation", "period"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"denseformer.{key}={value!r} must be an integer >= 1 (1 is the plain "
                                  "DenseFormer; the paper's kxp variants use k, p in 1..8)")
        depths = {"enc_layers": cfg.enc_layers}
        if cfg.arch == "encoder_decoder":
            depths["dec_layers"] = cfg.dec_layers
        for key, depth in depths.items():
            if self.period > depth:
                raise ConfigError(f"denseformer.period={self.period} is larger than {key}={depth}: no block "
                                  f"would be followed by a DWA; use a period in 1..{depth}")


def dwa_inputs(block: int, dilation: int) -> list[int]:
    """The indices j of the ``X_j`` that ``DWA_block`` averages (Sec. 3.2): ``j <= block``, ``j = block mod k``."""
    return list(range(block % dilation, block + 1, dilation))


class DepthWeightedAverage(DepthConnection):
    """The DWA modules of one stack of ``n_layers`` blocks: ``alphas[m]`` weights the inputs of the m-th DWA.

    ``state`` (one per run of the stack) is the list ``[X_0, X_1, ...]`` of the raw block outputs so far.
    """

    def __init__(self, n_layers: int, dilation: int, period: int, width: Optional[int] = None) -> None:
        """``width``: the model's d, for the cost model only (:meth:`traffic`)."""
        super().__init__()
        self.dilation = dilation
        self.width = width
        blocks = [i for i in range(1, n_layers + 1) if i % period == 0]
        # slot[index]: which DWA follows 0-based layer ``index`` (block i = index + 1), None where none does.
        self.slot: list[Optional[int]] = [blocks.index(i) if i in blocks else None for i in range(1, n_layers + 1)]
        weights = []
        for i in blocks:
            alpha = torch.zeros(len(dwa_inputs(i, dilation)))
            alpha[-1] = 1.0  # alpha_{i,i} = 1, the rest 0: the identity (Sec. 3.1)
            weights.append(nn.Parameter(alpha))
        self.alphas = nn.ParameterList(weights)

    def start(self, x: Tensor) -> tuple[Tensor, Any]:
        return x, [x]

    def traffic(self, batch: int, length: int, width: int) -> dict[str, float]:
        """Bytes a training step must move for the averages (:func:`interlayer.accounting.step_cost`): each DWA reads
        its k inputs and writes its output forward (fp32 residual states), and reads its output's gradient and writes
        the k inputs' gradients backward; the block outputs it keeps are activations their blocks save anyway."""
        reads = sum(len(w) + 1 for w in self.alphas)
        return {"depth averages": 8.0 * batch * length * reads * self.width} if self.width else {}

    def after_layer(self, index: int, h: Tensor, state: Any) -> Tensor:
        state.append(h)
        slot = self.slot[index]
        if slot is None:
            return h
        block = index + 1
        sources = state[block % self.dilation::self.dilation]
        alpha = self.alphas[slot].to(h.dtype)
        total = alpha[0] * sources[0]  # accumulated one input at a time: one fused kernel compiled (a stack of
        for weight, x in zip(alpha[1:], sources[1:]):  # more than 8 inputs, inductor copies into one buffer first)
            total = total + weight * x
        return total


class _DenseFormerMethod(MethodBase):
    name = "denseformer"
    config_class = DenseFormerConfig
    variants = {
        "denseformer": NamedVariant("DenseFormer 1x1: a depth-weighted average of the embeddings and every earlier "
                                    "block's output after each block, started at the identity (DenseFormer Sec. 3.1)",
                                    section_variant("denseformer", "DenseFormer",
                                                    STACK_REFUSAL.format(label="DenseFormer"))),
        "denseformer_2x2": NamedVariant("DenseFormer 2x2: dilation 2, a DWA after every second block (DenseFormer "
                                        "Sec. 3.2; the paper's deep models prefer 4x5, which a 4-layer stack cannot "
                                        "hold)", section_variant("denseformer", "DenseFormer",
                                                                 STACK_REFUSAL.format(label="DenseFormer"), dilation=2,
                                                                 period=2)),
    }
    examples = (CompositionExample("denseformer", {"dilation": 2, "period": 1}),)
    lm_examples = {"denseformer": {}}

    def customize(self, section: DenseFormerConfig, cfg: ComposedConfig, components: Components) -> None:
        if components.depth_connection != components.default_depth_connection:
            raise ConfigError("denseformer installs the stack's depth connection (its DWA modules), but another "
                              "method (hyper_connections: n residual streams) already did; the two cannot be "
                              "combined")

        def depth_connection(side: StackSide) -> DepthConnection:
            layers = cfg.enc_layers if side == "encoder" else cfg.dec_layers
            return DepthWeightedAverage(layers, section.dilation, section.period, cfg.d_model)

        components.depth_connection = depth_connection


METHOD = _DenseFormerMethod()
