"""Predictive Attention's map CNN, op by op: the one definition every path of it is held to (PA Sec. 3.3;
docs/methods/predictive.md).

The CNN reads the previous layer's attention logits as a ``(B, K, Tq, Tk)`` image with the K heads as channels:
non-finite values and the :func:`hidden_cells` zeroed, then each layer (:func:`conv_layer`) pads the map
(:func:`conv_padding`), convolves it, applies a (leaky) ReLU and zeroes the hidden cells again. :func:`reference`
is the whole CNN. It runs as the method's reference path and in incremental decoding
(``PredictiveMixer.predict_reference``); the map operator's reference (:func:`.map_conv.reference`) is one
:func:`conv_layer` and the fused operator's (:func:`.predictive_maps.reference`) calls :func:`reference`, so the
fast paths are all tested against this module.
"""
from __future__ import annotations

from typing import MutableMapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def hidden_cells(shape: Sequence[int], key_padding_mask: Optional[Tensor], causal: bool, device: torch.device,
                 q_offset: int = 0) -> Optional[Tensor]:
    """Boolean ``(B|1, 1, Tq, Tk)`` mask of the map cells the CNN must see as zero, or None when there are none.

    The rows and columns of padded tokens and, with causal attention, the upper triangle (a key after its query).
    A hidden cell must hold zero before *every* convolution, not just the first: after a convolution a padded cell
    holds ``ReLU(bias + spill from real neighbours)``, and the next convolution would carry that into real cells,
    so a sentence's outputs would depend on the padding of its batch (Table 5's 2- and 3-layer rows), and a causal
    cell would carry a later token's logit. Zeroed cells are what a 3 x 3 kernel reads beyond the edge of an
    unpadded map, so a padded sentence gives the same prediction as the sentence alone. The maps' rows are the
    queries at positions ``q_offset ..`` (incremental decoding keeps earlier rows in the cache), their columns every
    key so far.
    """
    t_q, t_k = shape[-2:]
    if t_k != q_offset + t_q:
        raise ValueError(f"predictive attention needs self-attention maps (keys = earlier and current queries), got "
                         f"{t_q} query rows from position {q_offset} over {t_k} keys")
    hidden = None
    if key_padding_mask is not None:
        hidden = key_padding_mask[:, q_offset:][:, None, :, None] | key_padding_mask[:, None, None, :]
    if causal:
        i = torch.arange(q_offset, t_k, device=device)[:, None]
        later = (torch.arange(t_k, device=device)[None, :] > i)[None, None]
        hidden = later if hidden is None else hidden | later
    return hidden


def conv_padding(kernel_size: Sequence[int], causal: bool) -> list[int]:
    """``(left, right, top, bottom)`` zeros around a map for a ``k_rows x k_cols`` kernel: centred, or the causal
    kernel's ``k_rows - 1`` rows above and none below, so that output row i reads input rows <= i (docs page,
    "Causal prediction"). Along the keys the kernel is centred either way."""
    k_rows, k_cols = kernel_size[-2:]
    if causal:
        return [k_cols // 2, k_cols // 2, k_rows - 1, 0]
    return [k_cols // 2, k_cols // 2, k_rows // 2, k_rows // 2]


def conv_layer(x: Tensor, weight: Tensor, bias: Tensor, hidden: Optional[Tensor], pads: Sequence[int],
               negative_slope: float) -> Tensor:
    """One layer of the CNN: ``F.pad`` by ``pads`` (:func:`conv_padding`), the library convolution, the leaky ReLU
    of ``negative_slope`` (0: the ReLU) and the ``hidden`` cells (a boolean mask broadcastable to the output, or
    None) zeroed."""
    out = F.leaky_relu(F.conv2d(F.pad(x, list(pads)), weight, bias), negative_slope)
    return out if hidden is None else out.masked_fill(hidden, 0.0)


def reference(maps: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], negative_slope: float,
              causal: bool, hidden: Optional[Tensor], rows: Optional[MutableMapping[str, Tensor]] = None) -> Tensor:
    """``CNN(maps)`` in fp32: non-finite values and the ``hidden`` cells (:func:`hidden_cells`) zeroed, then one
    :func:`conv_layer` per weight, its kernel centred or ``causal``; the output's hidden cells are zero too.

    ``rows``: incremental decoding's state (the layer cache's ``state`` dict), where the maps hold only the new
    query rows. A causal kernel's ``k - 1`` rows above them are then the last ``k - 1`` input rows of the same
    convolution at earlier steps, kept there as ``predictive_rows{n}`` and widened with zeros to the new keys (the
    upper triangle they gain is zero), instead of zeros.
    """
    x = maps.float()
    x = x.masked_fill(~torch.isfinite(x), 0.0)
    if hidden is not None:
        x = x.masked_fill(hidden, 0.0)
    for n, (weight, bias) in enumerate(zip(weights, biases)):
        pads = conv_padding(weight.shape, causal)
        if causal and rows is not None:
            x = _below_earlier_rows(x, rows, f"predictive_rows{n}", pads[2])
            pads = [pads[0], pads[1], 0, 0]
        x = conv_layer(x, weight.float(), bias.float(), hidden, pads, negative_slope)
    return x


def _below_earlier_rows(x: Tensor, rows: MutableMapping[str, Tensor], name: str, count: int) -> Tensor:
    """``x`` under the last ``count`` input rows kept as ``rows[name]`` (zeros at the first step), which then keeps
    the last ``count`` rows of the result for the next step."""
    earlier = rows.get(name)
    if earlier is None:
        earlier = x.new_zeros(x.shape[0], x.shape[1], count, x.shape[3])
    out = torch.cat([F.pad(earlier, (0, x.shape[3] - earlier.shape[3])), x], dim=2)
    rows[name] = out[:, :, out.shape[2] - count:]
    return out
