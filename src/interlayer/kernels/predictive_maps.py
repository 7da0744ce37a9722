"""Predictive Attention's map pipeline as one op: the CNN over the previous layer's logits, Eq. 4's mix with the
layer's own logits, and attention from the mixed logits.

    M   = alpha * CNN(A_prev) + (1 - alpha) * S          (PA Eq. 4; Evolving Attention with ``beta``)
    out = softmax(M masked) @ v,   M is also the next layer's A_prev

(``S``: the layer's logits ``q k^T / sqrt(d)`` (+ any relative-position bias); the CNN: 3 x 3 convolutions over
the heads as channels, each followed by a (leaky) ReLU, with the hidden cells (padding, a causal upper triangle)
zeroed before every convolution; see :mod:`interlayer.methods.predictive` for the paper's readings). Above a causal
diagonal ``M`` is not defined by the method: neither the attention nor the next layer's CNN reads those cells. The
kernels leave them unwritten (what the buffer held: any value, NaN included, which nothing reads; tested with a
buffer of NaNs), give ``S`` and ``A_prev`` zero gradient there, and ignore an incoming gradient there; the reference
keeps Eq. 4's ``(1 - alpha) S``. The paths agree on every cell a model reads, and the tests compare those.

Why one op: the method must move few bytes per map cell (eager, causal PA took 8.9x the plain model's step on an
H100, mostly in the library convolution and fp32 copies of the maps), and the op moves each map once per pass. Its
cost model (bytes a cell each way, against the reference's) and the bytes counted from its launches:
docs/methods/predictive.md ("What the fused op moves").

Dispatch (:func:`interlayer.kernels.dispatch.use_triton`): the kernels cover 3 x 3 convolutions over up to 16 heads
(:data:`CHANNELS`: GPT-2 small's 12, BERT-large's 16) on contiguous square maps, with or without a causal triangle
and key padding, 0 to any number of convolutions, ReLU or leaky ReLU, ``beta`` or not; anything else (another
kernel size, attention dropout while training, a KV cache) takes :func:`reference`, which is also the path on
CPUs.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from . import causal_logits, logits_attention, predictive_cnn
from .dispatch import use_triton
from .ops import kernel_op
from .tiles import PA_CHANNELS as CHANNELS


def reference(s: Tensor, prev: Tensor, v: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor],
              alpha: Any, beta: Any, slope: float, causal: bool, key_padding_mask: Optional[Tensor]
              ) -> tuple[Tensor, Tensor]:
    """``(out, M)`` op by op in fp32, as :class:`~interlayer.methods.predictive.PredictiveMixer` and the core's
    eager attention compute them (the definition the kernels are tested against): the CNN is
    :func:`.predictive_cnn.reference`."""
    residual = s.float()
    source = prev
    if beta is not None:
        source = residual = (1.0 - beta) * residual + beta * prev.float()
    hidden = predictive_cnn.hidden_cells(s.shape, key_padding_mask, causal, s.device)
    predicted = predictive_cnn.reference(source, weights, biases, slope, causal, hidden)
    mixed = torch.lerp(residual, predicted, alpha).to(s.dtype)
    return logits_attention.reference(mixed, v, key_padding_mask, causal), mixed


def _no_signs(like: Tensor) -> Tensor:
    return torch.empty(0, device=like.device, dtype=torch.uint8)


def _fake(s: Tensor, prev: Tensor, v: Tensor, alpha: Tensor, beta: Optional[Tensor],
          key_padding_mask: Optional[Tensor], causal: bool, slope: float, weights: list[Tensor], biases: list[Tensor],
          s_upper_unread: bool) -> list[Tensor]:
    b, h, t, _ = s.shape
    signs = s.new_empty(b, h, t, (t + 7) // 8, dtype=torch.uint8) if weights else _no_signs(s)
    return [v.new_empty(b, h, t, v.shape[-1]), torch.empty_like(s), s.new_empty(b, h, t, dtype=torch.float32),
            signs, *[torch.empty_like(s) for _ in range(len(weights) - 1)]]


def _backward(grad_out: Optional[Tensor], grad_mixed: Optional[Tensor], s: Optional[Tensor], prev: Tensor, v: Tensor,
              alpha: Tensor, beta: Optional[Tensor], key_padding_mask: Optional[Tensor], mixed: Tensor, out: Tensor,
              lse: Tensor, signs: Tensor, causal: bool, slope: float, weights: list[Tensor], biases: list[Tensor],
              intermediates: list[Tensor], s_upper_unread: bool) -> list[Tensor]:
    """``[dS, dA_prev, dv, *d weights, *d biases]``: the attention's backward with the map epilogue (``dZ`` of the
    last convolution and the residual's gradient, or without a CNN the whole of it), then the CNN's, last
    convolution first. ``s_upper_unread``: whatever made ``S`` reads its gradient on and below a causal diagonal
    only (:mod:`.causal_logits`), so nothing is written above it."""
    from . import logits_attention_triton as attention
    from . import predictive_maps_triton as maps

    n = len(weights)
    grad_out = grad_out if grad_out is not None else torch.zeros_like(out)
    epilogue = attention.MapEpilogue(alpha, beta, slope, signs if n else None, zero_above=not s_upper_unread)
    grad, grad_v, ds, dr = attention.backward(grad_out, mixed, v, key_padding_mask, out, lse, causal, grad_mixed,
                                              epilogue)
    grad_w: list[Tensor] = []
    grad_b: list[Tensor] = []
    for k in reversed(range(n)):
        x = prev if k == 0 else intermediates[k - 1]
        grad, dw, db = maps.conv_backward(grad, x, s if s is not None else prev, weights[k],
                                          None if k == 0 else intermediates[k - 1], beta, key_padding_mask, causal,
                                          slope, first=k == 0, ds=ds, dr=dr)
        grad_w.insert(0, dw)
        grad_b.insert(0, db)
    return [ds, grad, grad_v, *grad_w, *grad_b]


def _backward_fake(grad_out: Optional[Tensor], grad_mixed: Optional[Tensor], s: Optional[Tensor], prev: Tensor,
                   v: Tensor, alpha: Tensor, beta: Optional[Tensor], key_padding_mask: Optional[Tensor], mixed: Tensor,
                   out: Tensor, lse: Tensor, signs: Tensor, causal: bool, slope: float, weights: list[Tensor],
                   biases: list[Tensor], intermediates: list[Tensor], s_upper_unread: bool) -> list[Tensor]:
    return [torch.empty_like(mixed), torch.empty_like(prev), v.new_empty(v.shape),
            *[torch.empty_like(w) for w in weights], *[torch.empty_like(b) for b in biases]]


def _save(s: Tensor, prev: Tensor, v: Tensor, alpha: Tensor, beta: Optional[Tensor],
          key_padding_mask: Optional[Tensor], causal: bool, slope: float, weights: list[Tensor], biases: list[Tensor],
          s_upper_unread: bool, output: list[Tensor]) -> tuple:
    """What the backward reads besides the forward's outputs: the previous logits (the previous layer's own output,
    so no extra memory) and the layer's logits only with ``beta``."""
    out, mixed, lse, signs, *intermediates = output
    return (s if beta is not None else None, prev, v, alpha, beta, key_padding_mask, mixed, out, lse, signs, causal,
            slope, weights, biases, intermediates, s_upper_unread)


# Forward outputs: the attention output, the mixed logits M (both take gradients), each row's log-sum-exp, the sign
# bits of the CNN's last pre-activation (empty without a CNN) and the output of every convolution but the last (kept
# for the backward).
@kernel_op("interlayer::predictive_attention", fake=_fake, backward=_backward, backward_fake=_backward_fake,
           save=_save, grads=lambda grads: (grads[0], grads[1]),
           differentiable=("s", "prev", "v", "weights", "biases"))
def forward_op(s: Tensor, prev: Tensor, v: Tensor, alpha: Tensor, beta: Optional[Tensor],
               key_padding_mask: Optional[Tensor], causal: bool, slope: float, weights: list[Tensor],
               biases: list[Tensor], s_upper_unread: bool) -> list[Tensor]:
    """The Triton forward of PA's Eq. 4 followed by the attention over its result: each convolution of the prediction
    (the last one mixed with the layer's own logits), then softmax and the values."""
    from . import logits_attention_triton as attention
    from . import predictive_maps_triton as maps

    n = len(weights)
    intermediates, x, signs = [], prev, None
    for k in range(max(n, 1)):
        x, signs = maps.conv_forward(x, s, prev, weights[k] if n else None, biases[k] if n else None, alpha, beta,
                                     key_padding_mask, causal, slope, first=k == 0, final=k == max(n, 1) - 1)
        intermediates.append(x)
    mixed = intermediates.pop()
    out, lse = attention.forward(mixed, v, key_padding_mask, causal)
    return [out, mixed, lse, signs if signs is not None else _no_signs(s), *intermediates]


def covers(s: Tensor, weights: Sequence[Tensor]) -> bool:
    """What the kernels handle: contiguous square 4-D maps of at most :data:`CHANNELS` heads (and under 2^31 cells a
    batch element), 3 x 3 convolutions."""
    return (s.dim() == 4 and s.is_contiguous() and s.shape[-1] == s.shape[-2] and s.shape[1] <= CHANNELS
            and s.shape[1] * s.shape[-1] ** 2 < 2**31  # one batch element's maps: the kernels' 32-bit offsets
            and all(tuple(w.shape[-2:]) == (3, 3) for w in weights))


def predictive_attention(s: Tensor, prev: Tensor, v: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor],
                         alpha: Tensor, beta: Optional[Tensor], slope: float, causal: bool,
                         key_padding_mask: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``(attention output, mixed logits M)`` of one Predictive Attention layer (module doc). ``alpha`` and
    ``beta`` are 0-dim fp32 tensors on the maps' device (a warm-up ramp changes them without recompiling)."""
    weights, biases = list(weights), list(biases)
    if not use_triton(s, prev, v, covered=covers(s, weights), kernel="predictive-attention"):
        return reference(s, prev, v, weights, biases, alpha, beta, slope, causal, key_padding_mask)
    return _fused(s, prev, v, weights, biases, alpha, beta, slope, causal, key_padding_mask, False)


def _fused(s: Tensor, prev: Tensor, v: Tensor, weights: list[Tensor], biases: list[Tensor], alpha: Tensor,
           beta: Optional[Tensor], slope: float, causal: bool, key_padding_mask: Optional[Tensor],
           s_upper_unread: bool) -> tuple[Tensor, Tensor]:
    prev = (prev if prev.is_contiguous() else prev.contiguous()).to(s.dtype)
    out, mixed = forward_op(s, prev, v, alpha, beta, key_padding_mask, causal, slope,
                            [w.float().contiguous() for w in weights], [b.float().contiguous() for b in biases],
                            s_upper_unread)[:2]
    return out, mixed


def predictive_attention_qk(q: Tensor, k: Tensor, scale: float, prev: Tensor, v: Tensor, weights: Sequence[Tensor],
                            biases: Sequence[Tensor], alpha: Tensor, beta: Optional[Tensor], slope: float,
                            causal: bool, key_padding_mask: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """:func:`predictive_attention` of the logits ``S = scale q k^T``, computed here: on the kernels' causal path by
    :mod:`.causal_logits`, on and below the diagonal only (``S`` and its gradient above it are never written or
    read), else by the library's product."""
    weights, biases = list(weights), list(biases)
    if causal and use_triton(prev, q, k, v, covered=covers(prev, weights) and q.shape[-2] == prev.shape[-1],
                             kernel="predictive-attention"):
        s = causal_logits.causal_logits(q, k, scale)
        return _fused(s, prev, v, weights, biases, alpha, beta, slope, causal, key_padding_mask, True)
    return predictive_attention(causal_logits.reference(q, k, scale), prev, v, weights, biases, alpha, beta, slope,
                                causal, key_padding_mask)


def runs_kernel(prev: Tensor, v: Tensor, weights: Sequence[Tensor]) -> bool:
    """Whether :func:`predictive_attention` would run the kernels for maps shaped like ``prev`` (the one dispatch
    rule, asked before the layer computes anything, so a caller can keep its own path where they would not)."""
    return use_triton(prev, v, covered=covers(prev, weights), kernel="predictive-attention")
