"""Manifold-constrained hyper-connections, mHC (Xie, Wei, Cao et al., DeepSeek-AI, arXiv 2512.24880): hyper-connections
(:mod:`~interlayer.methods.hyper_connections`) whose residual mixing is projected onto the doubly stochastic
matrices, so the composite mapping over depth neither amplifies nor attenuates the streams. Every reading below is
argued, with its tests, in docs/methods/mhc.md.

Paper map (arXiv v2 numbers):

* **Layer update** (Eq. 3): ``x_{l+1} = H_res x_l + H_post^T F(H_pre x_l)``, ``x_l`` the n streams (n x C), a layer
  being a sublayer (Fig. 3), ``F`` with its pre-norm: :class:`ManifoldHyperConnection`, the sublayer's residual.
* **Coefficients** (Eq. 7) in the fused form of Eq. 14-16: ``[H~] = (1/r) [alpha vec(x) phi] + b``, ``r =
  ||vec(x)|| / sqrt(nC)``, ``phi = [phi_pre | phi_post | phi_res]`` one product, no tanh.
* **Constraints** (Eq. 8-9): ``H_pre = sigmoid``, ``H_post = 2 sigmoid``, ``H_res = Sinkhorn-Knopp(exp(H~_res))``
  (columns, then rows, ``sinkhorn_iters`` times): :func:`sinkhorn_knopp`.
* **Table 5**: n = 4, alpha 0.01, t_max = 20, RMSNorm eps 1e-20. **Stability** (Sec. 3.1, 5.4): the Amax gain of
  ``prod H_res``, :func:`composite_gain`.

Readings where the paper leaves room: the initialisation makes the model the plain pre-norm model at step 0
(``phi = 0``, ``H_post = 1``, ``H_res`` and ``H_pre`` within ``init_epsilon`` of HC's identity and one-hot); the
streams are summed at the exit; no weight decay on the static biases; ``dynamic=False`` keeps the biases only; an
overflow guard in Sinkhorn-Knopp; the coefficients in float32; every stack, pre-LN only, Multi-Pass refused (as
hyper-connections).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch
from torch import Tensor, nn

from ..core.components import Components, StackSide, SublayerKind
from ..errors import ConfigError
from ..kernels.hyper_connections import State, depth_connection, materialize, width_mix
from ..kernels.precision import fp32_island
from .base import (
    MAX_MULTIPLIER,
    STACK_REFUSAL,
    ComposedConfig,
    CompositionExample,
    Conflict,
    MethodBase,
    NamedVariant,
    check_at_most,
    section_variant,
)
from .hyper_connections import STREAM_DTYPES, SUBLAYERS, StreamDtype, Streams, stream_traffic

MAX_SINKHORN_ITERS = 1000  # fifty times Table 5's 20: more only costs time


@dataclass
class MHCConfig:
    """Options (see the module docstring for the paper references).

    * ``rate``: the expansion rate n (Table 5: 4).
    * ``dynamic``: Eq. 7's dynamic and static coefficients, or the static ones alone (not a variant of the paper).
    * ``sinkhorn_iters``: ``t_max`` of Eq. 9 (Sec. 4.2 and Table 5: 20).
    * ``scale_init``: the gating factors ``alpha`` at initialisation (Table 5: 0.01).
    * ``norm_eps``: the epsilon of Eq. 7's RMSNorm (Table 5: 1e-20).
    * ``init_epsilon``: how far ``H_pre`` and ``H_res`` start from HC's one-hot and identity (see the docstring).
    * ``stream_dtype``: the n streams' storage, as hyper-connections' (None, the default: the embedded input's).
    """

    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset({"rate"})  # sizes the saved tensors (checkpoint.py)
    rate: int = 4
    dynamic: bool = True
    sinkhorn_iters: int = 20
    scale_init: float = 0.01
    norm_eps: float = 1e-20
    init_epsilon: float = 0.01
    stream_dtype: Optional[StreamDtype] = None

    def validate(self, cfg: ComposedConfig) -> None:
        for key, low in (("rate", 1), ("sinkhorn_iters", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"mhc.{key}={value!r} must be an integer >= {low} (the paper: rate 4, "
                                  "sinkhorn_iters 20)")
        check_at_most("mhc.rate", self.rate, MAX_MULTIPLIER,
                      "every layer keeps that many copies of the residual stream (Table 5: 4)")
        check_at_most("mhc.sinkhorn_iters", self.sinkhorn_iters, MAX_SINKHORN_ITERS,
                      "every layer of every forward pass runs that many normalisations (Table 5: 20)")
        if not self.norm_eps > 0:
            raise ConfigError(f"mhc.norm_eps={self.norm_eps!r} must be > 0 (Table 5: 1e-20)")
        if not 0 < self.init_epsilon < 1 / self.rate:
            raise ConfigError(f"mhc.init_epsilon={self.init_epsilon!r} must be in (0, 1/rate) = "
                              f"(0, {1 / self.rate:g}): "
                              "H_pre and H_res start at weight 1-(n-1)*eps on one stream and eps on each other; at "
                              "1/rate every stream would be read alike and the streams would never differ")
        if not cfg.norm_first:
            raise ConfigError("mhc needs norm_first=True (pre-LN): the paper's mHC replaces the pre-norm residual "
                              "(its sublayers F include their pre-norm); got norm_first=False")


def sinkhorn_knopp(logits: Tensor, iters: int) -> Tensor:
    """Eq. 9 on ``(..., n, n)``: ``M^(0) = exp(logits)``, then ``iters`` times columns then rows normalised. The
    largest entry is subtracted before ``exp`` (the first column normalisation cancels that common factor), and a
    sum is never taken below the dtype's smallest normal number, so logits hundreds apart, whose ``exp`` underflows
    to a zero column, give zeros there instead of 0/0 (otherwise the sums are far above it: Eq. 9 exactly)."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    tiny = torch.finfo(m.dtype).tiny
    for _ in range(iters):
        m = m / m.sum(-2, keepdim=True).clamp_min(tiny)  # T_c
        m = m / m.sum(-1, keepdim=True).clamp_min(tiny)  # T_r
    return m


class ManifoldHyperConnection(nn.Module):
    """The residual module of one sublayer (``Components.residual``): :meth:`split` computes ``H_pre, H_post,
    H_res`` (Eq. 7-9) and the sublayer's input ``H_pre x_l``, :meth:`combine` adds ``H_post^T F`` to the kept
    ``H_res x_l`` (Eq. 3). Streams are stacked first, ``(n, ..., C)``, as hyper-connections', and the mixes go
    through the same interface (:func:`interlayer.kernels.hyper_connections.width_mix`): HC's fused kernels on a GPU,
    element-wise sums elsewhere (which inductor fuses; a batched product of inner size n it could not).

    Parameters: ``phi`` ``[phi_pre | phi_post | phi_res]`` (``nC x (n^2 + 2n)``; dynamic only), ``alpha`` (``alpha_pre,
    alpha_post, alpha_res``; dynamic only), ``static`` ``[b_pre | b_post | vec(b_res)]`` (``n^2 + 2n``).
    """

    def __init__(self, d_model: int, rate: int, index: int, *, dynamic: bool, sinkhorn_iters: int,
                 scale_init: float, norm_eps: float, init_epsilon: float, dropout: float, eps: float,
                 bias: bool) -> None:
        super().__init__()
        n = self.rate = rate
        self.sinkhorn_iters, self.norm_eps, self.dynamic = sinkhorn_iters, norm_eps, dynamic
        self.norm = nn.LayerNorm(d_model, eps=eps, bias=bias)  # the sublayer's own pre-norm (part of F)
        self.dropout = nn.Dropout(dropout)
        pre = torch.full((n,), init_epsilon)
        pre[index % n] = 1 - (n - 1) * init_epsilon if n > 1 else 1 - init_epsilon  # sigmoid never reaches 1
        res = torch.full((n, n), init_epsilon).fill_diagonal_(1 - (n - 1) * init_epsilon)
        self.static = nn.Parameter(torch.cat([torch.logit(pre), torch.zeros(n), torch.log(res).flatten()]))
        self.no_weight_decay = ("static",)  # HC Sec. 4: no weight decay on the static component
        if dynamic:
            self.phi = nn.Parameter(torch.zeros(n * d_model, n * n + 2 * n))
            self.alpha = nn.Parameter(torch.full((3,), float(scale_init)))
            # Which alpha scales each coefficient: alpha_pre for n, alpha_post for n, alpha_res for n^2.
            # (tensor operations, not a Python list of n^2 ints: a shapes-only build of a saved config costs nothing)
            alpha_index = torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=torch.long),
                                     torch.full((n * n,), 2, dtype=torch.long)])
            self.register_buffer("alpha_index", alpha_index, persistent=False)

    def mappings(self, streams: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``H_pre`` ``(..., n)``, ``H_post`` ``(..., n)``, ``H_res`` ``(..., n, n)`` at every position of ``streams``
        ``(n, ..., C)`` (static: ``(n,)``, ``(n,)``, ``(n, n)``), in float32 (float64 for float64 streams)."""
        n = self.rate
        dtype = torch.promote_types(streams.dtype, torch.float32)
        with fp32_island(streams.device):
            coefficients = self.static.to(dtype)
            if self.dynamic:
                x = streams.to(dtype)
                width = x.shape[-1]
                inv_r = torch.rsqrt(x.pow(2).sum((0, -1)) / (n * width) + self.norm_eps)  # 1/r, Eq. 15
                phi = self.phi.to(dtype)
                scaled = x[0] @ phi[:width]  # Eq. 14, vec(x_l) phi as n products (vec(x_l) is stream j's rows j*C..)
                for j in range(1, n):
                    scaled = scaled + x[j] @ phi[j * width:(j + 1) * width]
                coefficients = self.alpha.to(dtype)[self.alpha_index] * (scaled * inv_r[..., None]) + coefficients
            pre = torch.sigmoid(coefficients[..., :n])
            post = 2 * torch.sigmoid(coefficients[..., n:2 * n])
            res = sinkhorn_knopp(coefficients[..., 2 * n:].unflatten(-1, (n, n)), self.sinkhorn_iters)
        return pre, post, res

    def split(self, streams: State, branch_add: Optional[Tensor] = None) -> tuple[Tensor, Any]:
        """``H_pre x_l`` (then the sublayer's pre-norm) and the carry for :meth:`combine` (``H_res x_l``, ``H_post``).
        The coefficients are packed as the hyper-connection kernels take them: row j is ``[H_pre[j] | H_res[:, j] |
        H_post[j]]``. Dynamic coefficients read the streams, so a pending state is written first; static ones do
        not, and the previous sublayer's pending depth connection is applied in the same pass."""
        state = materialize(streams) if self.dynamic else streams
        pre, post, res = self.mappings(state if isinstance(state, Tensor) else state.streams)
        coef = torch.cat([pre.unsqueeze(-1), res.transpose(-1, -2), post.unsqueeze(-1)], dim=-1)
        h_in, carry = width_mix(state, coef)
        if branch_add is not None:
            h_in = h_in + branch_add
        return self.norm(h_in.to(self.norm.weight.dtype)), carry

    def combine(self, carry: Any, branch_out: Tensor) -> State:
        """Eq. 3: ``H_res x_l + H_post^T F(H_pre x_l)`` (on the kernel path, pending until the next width mix or
        the streams' sum)."""
        return depth_connection(carry, self.dropout(branch_out))

    def traffic(self, batch: int, length: int, width: int) -> dict[str, float]:
        return stream_traffic(self.rate, self.norm.normalized_shape[0], batch * length, width)

    def madds(self, t: int) -> int:
        """The product ``vec(x) phi`` (dynamic) and the mixing ``[H_pre; H_res] x`` (the scaling by ``H_post`` and
        the residual sum are element-wise, not counted, as residual additions are not)."""
        n, d = self.rate, self.norm.normalized_shape[0]
        return t * (n + 1) * n * d + (t * n * d * (n * n + 2 * n) if self.dynamic else 0)


def composite_gain(mappings: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Sec. 3.1's "Amax Gain Magnitude" of ``prod H_res`` over ``mappings`` (each ``(..., n, n)``, in layer order):
    the largest absolute row sum (forward) and column sum (backward) of the composite, over every position."""
    composite = mappings[0]
    for h_res in mappings[1:]:
        composite = h_res @ composite  # x_L = H_res_{L-1} ... H_res_l x_l (Eq. 4)
    return composite.sum(-1).abs().amax(), composite.sum(-2).abs().amax()


class _MHCMethod(MethodBase):
    name = "mhc"
    config_class = MHCConfig
    variants = {
        "mhc": NamedVariant("mHC: hyper-connections x4 whose residual mixing is doubly stochastic (20 Sinkhorn-Knopp "
                            "iterations), started as the plain model (mHC Sec. 4.2, Eq. 7-9, Table 5); needs pre-LN",
                            section_variant("mhc", "mHC", STACK_REFUSAL.format(label="mHC"))),
    }
    examples = (CompositionExample("mhc", {"rate": 2}, core={"norm_first": True}),)  # the paper's pre-LN form
    lm_examples = {"mhc": {"rate": 2}}
    conflicts = (Conflict("multipass", "neither paper says which stream"),
                 Conflict("hyper_connections", "mhc and hyper_connections"),
                 Conflict("denseformer", "mhc and denseformer"), Conflict("muddformer", "mhc and muddformer"))

    def validate(self, section: MHCConfig, cfg: ComposedConfig) -> None:
        """Checked on the config, so the refusal does not depend on the order the methods customise in."""
        section.validate(cfg)
        if cfg.multipass is not None:
            raise ConfigError("mhc carries n streams through the stack, but multipass adds one pass's layer outputs "
                              "(d-vectors) to the next pass's layer inputs; neither paper says which stream would "
                              "receive them, so the two cannot be combined (remove one section)")
        for other, what in (("hyper_connections", "unconstrained streams"), ("denseformer", "depth-weighted averages"),
                            ("muddformer", "dense aggregates")):
            if getattr(cfg, other) is not None:
                raise ConfigError(f"mhc and {other} both replace the stack's residual path (n constrained streams vs "
                                  f"{what}); the two cannot be combined (remove one section)")

    def customize(self, section: MHCConfig, cfg: ComposedConfig, components: Components) -> None:
        def residual(side: StackSide, index: int, kind: SublayerKind) -> nn.Module:
            kinds = SUBLAYERS[side]
            return ManifoldHyperConnection(
                cfg.d_model, section.rate, index * len(kinds) + kinds.index(kind), dynamic=section.dynamic,
                sinkhorn_iters=section.sinkhorn_iters, scale_init=section.scale_init, norm_eps=section.norm_eps,
                init_epsilon=section.init_epsilon, dropout=cfg.dropout, eps=cfg.layer_norm_eps, bias=cfg.bias)

        components.residual = residual
        components.depth_connection = lambda side: Streams(section.rate, STREAM_DTYPES[section.stream_dtype])


METHOD = _MHCMethod()
