"""Hyper-connections (Zhu et al., "Hyper-Connections", ICLR 2025, arXiv 2409.19606): the residual stream widened to
n streams, with learned static or input-dependent ("dynamic") weights deciding what each sublayer reads and where
its output goes. Every reading below is argued in docs/methods/hyper_connections.md (with the kernels' costs).

Paper map (arXiv v3 numbers):

* **Streams** (Sec. 2.1, Algorithm 1): ``H`` (n x d), the input copied into each row, the rows summed before the
  final norm: :class:`Streams`, the stack's depth connection.
* **Static HC** (Eq. 1-7): per sublayer ``T`` (each attention, cross-attention and FFN, its pre-norm included;
  Algorithm 3), ``h_0 = A_m^T H`` (Eq. 3), ``H = B^T T(h_0)^T + A_r^T H`` (Eq. 4-5): :class:`HyperConnection`, the
  sublayer's residual module (``split`` the width connection, ``combine`` the depth connection).
* **Dynamic HC** (Eq. 8-13): ``H_bar = norm(H)``; ``B(H) = s_beta tanh(H_bar W_beta)^T + B``, ``A_m(H) = s_alpha
  tanh(H_bar W_m) + A_m``, ``A_r(H) = s_alpha tanh(H_bar W_r) + A_r``: the dynamic part added to the static one.
* **Initialisation** (Eq. 14): ``A_m = e_{k mod n}``, ``A_r = I``, ``B = 1``, dynamic weights 0, ``s = 0.01``
  (Algorithm 2); n = 1 static is exactly the pre-norm residual (Eq. 15). No weight decay on the static matrices
  (Sec. 4). Parameters: App. B, Eq. 21-25. Default: DHC, n = 4 (Sec. 4.1).

Readings where the paper leaves room: ``k`` counts sublayers (``input_index="layer"``: layers); post-LN and
Multi-Pass are refused; every stack gets its own streams (the causal LM stays causal, cached decoding exact); the
recorded states are the sums of the streams; Sec. 4's sqrt(n) output-layer initialisation is not applied. The
PyTorch code here is the reference path; on a GPU the connections run as fused Triton kernels
(:mod:`interlayer.kernels.hyper_connections`, one dispatch rule).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Optional

import torch
from torch import Tensor, nn

from ..core.components import Components, StackSide, SublayerKind
from ..core.layers import DepthConnection
from ..errors import ConfigError
from ..kernels.hyper_connections import HCParams, State, depth_connection, stream_sum, width_connection
from .base import (
    MAX_MULTIPLIER,
    STACK_REFUSAL,
    ComposedConfig,
    CompositionExample,
    Conflict,
    MethodBase,
    NamedVariant,
    VariantContext,
    check_at_most,
    section_variant,
)

InputIndex = Literal["sublayer", "layer"]
StreamDtype = Literal["bfloat16", "float16"]
STREAM_DTYPES: dict[Optional[str], Optional[torch.dtype]] = {None: None, "bfloat16": torch.bfloat16,
                                                             "float16": torch.float16}
SUBLAYERS: dict[StackSide, tuple[SublayerKind, ...]] = {"encoder": ("attn", "ffn"), "decoder": ("attn", "cross", "ffn")}


def stream_traffic(rate: int, d: int, tokens: int, width: int) -> dict[str, float]:
    """Bytes a training step must move around one sublayer of an n-stream residual (hyper-connections, mHC;
    :func:`interlayer.accounting.step_cost`): the n fp32 streams read and written forward and their gradients read
    and written backward (16 n bytes a channel, the floor of any implementation that keeps the streams in fp32), and
    the sublayer norm's output (as the plain residual), ``width`` bytes an element."""
    return {"residual stream": 16.0 * rate * tokens * d, "activations": (2.0 * width + 4.0) * tokens * d}


@dataclass
class HyperConnectionsConfig:
    """Options (see the module docstring for the paper references).

    * ``rate``: the expansion rate n (the paper's LM experiments: 1, 2, 4, 8; its default 4, Sec. 4.1). 1 with
      ``dynamic=False`` is exactly the plain pre-norm model.
    * ``dynamic``: DHC (Sec. 2.2) or SHC (Sec. 2.1).
    * ``scale_init``: the initial ``s_alpha`` and ``s_beta`` (0.01, the paper's pseudo-code).
    * ``input_index``: what k of ``A_m = e_{k mod n}`` counts: ``sublayer`` (the paper's layers T^k) or ``layer``.
    * ``stream_dtype``: the n streams' storage, None (the default, the paper's) for the embedded input's dtype
      (float32 in training), or 16 bits: half the streams' traffic, but the residual rounded at every sublayer (the
      mixes compute in float32 either way); docs/methods/hyper_connections.md gives the error measured.
    """

    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"rate"})  # sizes the saved tensors (checkpoint.py)

    rate: int = 4
    dynamic: bool = True
    scale_init: float = 0.01
    input_index: InputIndex = "sublayer"
    stream_dtype: Optional[StreamDtype] = None

    def validate(self, cfg: ComposedConfig) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, int) or self.rate < 1:
            raise ConfigError(f"hyper_connections.rate={self.rate!r} must be an integer >= 1 (the expansion rate "
                              "n; the paper uses 2, 4, 8)")
        check_at_most("hyper_connections.rate", self.rate, MAX_MULTIPLIER,
                      "every layer keeps that many copies of the residual stream (the paper uses 1 to 8)")
        if not math.isfinite(self.scale_init):
            raise ConfigError(f"hyper_connections.scale_init={self.scale_init!r} must be a finite number "
                              "(the paper's 0.01)")
        if not cfg.norm_first:
            raise ConfigError("hyper_connections needs norm_first=True (pre-LN): the paper replaces the pre-norm "
                              "residual and defines post-norm only as a fixed n=1 hyper-connection, not a learned "
                              "one; got norm_first=False")


class HyperConnection(nn.Module):
    """The residual module of one sublayer (``Components.residual``): :meth:`split` is the width connection
    (Eq. 3-4, with the dynamic weights of Eq. 10-13), :meth:`combine` the depth connection (Eq. 5).

    The stack state is ``(n, ..., d)`` (the stream index first). ``static_alpha`` is ``[A_m | A_r]`` (n x (n+1)),
    ``static_beta`` is ``B``;
    ``dynamic_weight`` is ``[W_m | W_r | W_beta]`` (d x (n+2)), one product for all three.
    """

    def __init__(self, d_model: int, rate: int, index: int, *, dynamic: bool, scale_init: float, dropout: float,
                 eps: float, bias: bool) -> None:
        super().__init__()
        self.rate = rate
        self.norm = nn.LayerNorm(d_model, eps=eps, bias=bias)  # the sublayer's own pre-norm (part of T)
        self.dropout = nn.Dropout(dropout)
        a_m = torch.zeros(rate, 1)
        a_m[index % rate, 0] = 1.0
        self.static_alpha = nn.Parameter(torch.cat([a_m, torch.eye(rate)], dim=1))
        self.static_beta = nn.Parameter(torch.ones(rate))
        # Sec. 4 "Implementation": "The static component ... does not utilize weight decay, whereas the dynamic
        # component does" (read by the training engine's parameter groups).
        self.no_weight_decay = ("static_alpha", "static_beta")
        self.dynamic = dynamic
        if dynamic:
            self.stream_norm = nn.LayerNorm(d_model, eps=eps, bias=bias)
            self.dynamic_weight = nn.Parameter(torch.zeros(d_model, rate + 2))
            self.alpha_scale = nn.Parameter(torch.tensor(float(scale_init)))
            self.beta_scale = nn.Parameter(torch.tensor(float(scale_init)))

    def params(self) -> HCParams:
        """The parameters as the kernels' module takes them (the dynamic ones None for SHC)."""
        if not self.dynamic:
            return HCParams(self.static_alpha, self.static_beta)
        return HCParams(self.static_alpha, self.static_beta, self.dynamic_weight, self.stream_norm.weight,
                        self.stream_norm.bias, self.alpha_scale, self.beta_scale, self.stream_norm.eps)

    def split(self, streams: State, branch_add: Optional[Tensor] = None) -> tuple[Tensor, Any]:
        """The width connection (Eq. 3-4): ``[A_m | A_r]^T H``, row 0 the sublayer's input ``A_m^T H`` (then its
        pre-norm), rows 1.. the kept streams ``A_r^T H`` (the carry). ``streams`` is the stack state, ``(n, ..., d)``,
        or, on the kernel path, the previous sublayer's pending depth connection, written in the same pass
        (interlayer.kernels.hyper_connections)."""
        h0, carry = width_connection(streams, self.params())
        if branch_add is not None:
            h0 = h0 + branch_add
        return self.norm(h0.to(self.norm.weight.dtype)), carry  # 16-bit streams: the norm reads its own dtype

    def combine(self, carry: Any, branch_out: Tensor) -> State:
        """Eq. 5: ``B^T T(h_0) + H'``, the sublayer's output scaled into every stream (on the kernel path, pending
        until the next width connection or the streams' sum)."""
        return depth_connection(carry, self.dropout(branch_out))

    def traffic(self, batch: int, length: int, width: int) -> dict[str, float]:
        return stream_traffic(self.rate, self.norm.normalized_shape[0], batch * length, width)

    def madds(self, t: int) -> int:
        """The width connection ``[A_m | A_r]^T H`` and, when dynamic, the projection ``norm(H) W`` (the depth
        connection's scaled addition is element-wise and not counted, as residual additions are not)."""
        n, d = self.rate, self.norm.normalized_shape[0]
        return t * n * (n + 1) * d + (t * n * d * (n + 2) if self.dynamic else 0)


class Streams(DepthConnection):
    """Enter the n streams (copies of the embedded input) and leave them by their sum (Sec. 2.1, Algorithm 1). The
    streams are stacked first, ``(n, ..., d)``, so a stream is a contiguous ``(..., d)`` tensor; ``dtype`` (None:
    the input's) is their storage, the sum leaves in the input's dtype. Hyper-connections' and mHC's."""

    def __init__(self, rate: int, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        self.rate = rate
        self.dtype = dtype

    def start(self, x: Tensor) -> tuple[Tensor, Any]:
        return x.to(self.dtype or x.dtype).unsqueeze(0).expand(self.rate, *x.shape), x.dtype

    def finish(self, h: State, state: Any) -> Tensor:
        return stream_sum(h).to(state)

    def view(self, h: State) -> Tensor:
        return stream_sum(h)


def _variant(dynamic: bool) -> Callable[[VariantContext], dict[str, Any]]:
    return section_variant("hyper_connections", "Hyper-connections", STACK_REFUSAL.format(label="Hyper-connections"),
                           rate=4, dynamic=dynamic)


class _HyperConnectionsMethod(MethodBase):
    name = "hyper_connections"
    config_class = HyperConnectionsConfig
    variants = {
        "hyper_connections": NamedVariant("Dynamic hyper-connections, expansion rate 4 (DHCx4, the paper's default; "
                                          "Hyper-Connections Sec. 2.2, Sec. 4.1); needs pre-LN", _variant(True)),
        "hyper_connections_static": NamedVariant("Static hyper-connections, expansion rate 4 (SHCx4; "
                                                 "Hyper-Connections Sec. 2.1); needs pre-LN", _variant(False)),
    }
    # the papers' pre-LN form
    examples = (CompositionExample("hyper_connections", {"rate": 2}, core={"norm_first": True}),)
    lm_examples = {"hyper_connections": {"rate": 2}}
    # validate: the streams leave no d-vector for a pass to add, nor a single output for a DWA to average
    conflicts = (Conflict("multipass", "neither paper says which stream"),
                 Conflict("denseformer", "cannot be combined"))

    def validate(self, section: HyperConnectionsConfig, cfg: ComposedConfig) -> None:
        """Checked on the config, so the refusal does not depend on the order the methods customise in."""
        section.validate(cfg)
        if cfg.multipass is not None:
            raise ConfigError("hyper_connections carry n streams through the stack, but multipass adds one pass's "
                              "layer outputs (d-vectors) to the next pass's layer inputs; neither paper says which "
                              "stream would receive them, so the two cannot be combined (remove one section)")
        if cfg.denseformer is not None:
            raise ConfigError("hyper_connections and denseformer both replace the stack's depth connection (n "
                              "streams vs depth-weighted averages of the block outputs); the two cannot be combined "
                              "(remove one section)")

    def customize(self, section: HyperConnectionsConfig, cfg: ComposedConfig, components: Components) -> None:
        def residual(side: StackSide, index: int, kind: SublayerKind) -> nn.Module:
            kinds = SUBLAYERS[side]
            k = index * len(kinds) + kinds.index(kind) if section.input_index == "sublayer" else index
            return HyperConnection(cfg.d_model, section.rate, k, dynamic=section.dynamic,
                                   scale_init=section.scale_init, dropout=cfg.dropout, eps=cfg.layer_norm_eps,
                                   bias=cfg.bias)

        components.residual = residual
        components.depth_connection = lambda side: Streams(section.rate, STREAM_DTYPES[section.stream_dtype])


METHOD = _HyperConnectionsMethod()
