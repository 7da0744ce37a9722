"""The Transformer encoder: embedding, a stack of :class:`EncoderLayer`, and (pre-LN) a final LayerNorm.

The same stack is the body of the decoder-only language model (``arch="causal_lm"``): there every layer's
self-attention is causal and may keep a :class:`~interlayer.core.attention.KVCache`. Causality is a property of
the encoder (``self.causal``, from the config), not an argument of :meth:`Encoder.process`, so an encoder that
runs the stack its own way (Multi-Pass runs it once per pass through :meth:`Encoder.run_layers`) is causal in
every pass without knowing about it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union, overload

from torch import Tensor, nn

from .attention import AttentionIntermediates, KVCache, KVHistory
from .components import Components
from .config import TransformerConfig
from .embedding import InputEmbedding
from .layers import ActivationCheckpointing, DepthConnection, EncoderLayer, layer_call, logits_wanted, shares_kv

# Called before layer i with the states so far; returns (added to the layer input, added to its attention branch).
Injector = Callable[[int], tuple[Optional[Tensor], Optional[Tensor]]]


class StateViews(Sequence[Tensor]):
    """Each layer's stack state read as ``(..., d_model)`` through the depth connection's :meth:`~interlayer.core.
    layers.DepthConnection.view`, computed when first read (then kept).

    Why lazily: a depth connection's state may be wider than ``d_model`` and its view a pass over it
    (hyper-connections' n streams are summed), while only hidden-state outputs and Multi-Pass read the records;
    computing every view at every layer would add that pass to every forward. The records hold the states
    themselves until read or dropped (under autograd they are kept for the backward pass anyway)."""

    def __init__(self, states: list[Any], view: Callable[[Any], Tensor]) -> None:
        self._states, self._view = states, view
        self._views: dict[int, Tensor] = {}

    def __len__(self) -> int:
        return len(self._states)

    @overload
    def __getitem__(self, index: int) -> Tensor: ...

    @overload
    def __getitem__(self, index: slice) -> list[Tensor]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[Tensor, list[Tensor]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]  # negative indices, and the IndexError past the end
        if i not in self._views:
            self._views[i] = self._view(self._states[i])
        return self._views[i]


@dataclass
class EncoderOutput:
    """What an encoder stack returns: its output and padding, and what methods and pictures read of each layer (outputs,
    mid-layer states, attention intermediates); ``exits`` for models trained on several outputs."""

    hidden: Tensor  # (B, T, d) the encoder's output (after the final LayerNorm in pre-LN)
    padding_mask: Optional[Tensor]  # (B, T) True at padding
    states: Sequence[Tensor]  # each layer's output, before the final LayerNorm (a list, or StateViews)
    mids: Sequence[Tensor]  # each layer's state after its self-attention sublayer
    attentions: list[Optional[AttentionIntermediates]]
    # Further outputs that each also receive the training loss (multi-exit training, e.g. one per MPT pass);
    # None means the single output ``hidden``.
    exits: Optional[list[Tensor]] = None
    embedded: Optional[Tensor] = None  # the stack's input (embeddings; HF's hidden_states[0])


class Encoder(nn.Module):
    """The encoder stack: the input embedding, ``enc_layers`` self-attention layers built from the components' factories
    (so every method reaches them), the optional depth connection around them, and the final LayerNorm in pre-LN.

    It is also a causal language model's stack (``arch="causal_lm"``: ``causal`` set, a ``KVCache`` per layer when
    decoding). Methods that run the stack differently subclass it and override :meth:`process` (Multi-Pass);
    :meth:`run_layers` is the one loop, where each layer's logits reach the next layer's mixer and the K/V history
    reaches the layers that read it."""

    def __init__(self, cfg: TransformerConfig, components: Components, tokens: Optional[nn.Embedding]) -> None:
        super().__init__()
        self.pad_id = cfg.pad_id
        self.causal = cfg.arch == "causal_lm"
        self.embed = InputEmbedding(cfg, tokens)
        residual = components.residual
        self.layers = nn.ModuleList(
            EncoderLayer(components.self_attention("encoder", i), components.ffn("encoder", i), cfg.d_model,
                         dropout=cfg.dropout, norm_first=cfg.norm_first, eps=cfg.layer_norm_eps, bias=cfg.bias,
                         residuals=(residual("encoder", i, "attn"), residual("encoder", i, "ffn")))
            for i in range(cfg.enc_layers))
        self.depth: Optional[DepthConnection] = components.depth_connection("encoder")
        self.final_norm = (nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias) if cfg.norm_first
                           else None)
        # Layer i must return its logits when layer i+1 mixes them in (predictive attention): alone where its
        # self-attention can, else with every intermediate.
        self._logits_wanted = logits_wanted(self.layers)
        # Some layer reuses earlier layers' keys/values (attention.KVSource): each run keeps a KVHistory.
        self._shares_kv = shares_kv(self.layers)
        # Set by the model's gradient_checkpointing_enable (core/hub.py); None: every layer keeps its activations.
        self.activation_checkpointing: Optional[ActivationCheckpointing] = None

    def forward(self, tokens: Optional[Tensor] = None, *, key_padding_mask: Optional[Tensor] = None,
                inputs_embeds: Optional[Tensor] = None, segments: Optional[Tensor] = None,
                need_intermediates: bool = False, padded: bool = True) -> EncoderOutput:
        """``padded=False``: the caller knows ``tokens`` hold no padding (a batch it built on the host), so no mask
        is made from the pad id and attention may take the flash kernel, which takes no mask (a mask of all False
        means the same but forces a slower kernel, and finding that it is all False would wait for the device)."""
        if key_padding_mask is None and tokens is not None and padded:
            key_padding_mask = tokens.eq(self.pad_id)
        x = self.embed(tokens, inputs_embeds=inputs_embeds, segments=segments)
        return self.process(x, key_padding_mask, need_intermediates=need_intermediates)

    def process(self, x: Tensor, key_padding_mask: Optional[Tensor], *, need_intermediates: bool = False
                ) -> EncoderOutput:
        """The stack over the embedded input; an encoder that runs it differently (Multi-Pass) overrides this."""
        return self.run_layers(x, key_padding_mask, need_intermediates=need_intermediates)

    def run_layers(self, x: Tensor, key_padding_mask: Optional[Tensor], *, injector: Optional[Injector] = None,
                   need_intermediates: bool = False, cache: Optional[list[KVCache]] = None) -> EncoderOutput:
        """Run the stack once over embedded input ``x``; ``injector`` adds cross-pass inputs (Multi-Pass).

        ``cache`` (one :class:`KVCache` per layer, causal stacks only) makes ``x`` the new positions of a sequence
        whose earlier positions the caches hold; ``key_padding_mask`` then covers every position, cached and new.
        """
        states: list[Any] = []  # the stack states; with a depth connection, read through its view (StateViews)
        mids: list[Any] = []
        attentions: list[Optional[AttentionIntermediates]] = []
        prev_logits: Optional[Tensor] = None
        embedded = x
        kv_history: Optional[KVHistory] = [] if self._shares_kv else None  # per run: a Multi-Pass pass has its own
        depth = self.depth
        if depth is not None:
            x, depth_state = depth.start(x)
        for i, layer in enumerate(self.layers):
            input_add, branch_add = injector(i) if injector is not None else (None, None)
            attn_inputs = depth.attention_inputs(i, depth_state) if depth is not None else None
            if input_add is not None:  # the layer's input in every role it plays
                x = x + input_add
                attn_inputs = None if attn_inputs is None else tuple(t + input_add for t in attn_inputs)
            extra = {} if attn_inputs is None else {"attn_inputs": attn_inputs}
            needed, alone = self._logits_wanted[i]
            out = layer_call(self, i, layer, cache is not None)(
                x, key_padding_mask=key_padding_mask, prev_logits=prev_logits, branch_add=branch_add,
                need_intermediates=need_intermediates or (needed and not alone),
                need_logits=alone and not need_intermediates, causal=self.causal,
                cache=cache[i] if cache is not None else None, kv_history=kv_history, **extra)
            x = out.hidden
            prev_logits = out.attention.logits if out.attention is not None else None
            if depth is not None:
                x = depth.after_layer(i, x, depth_state)
            states.append(x)
            mids.append(out.mid)
            attentions.append(out.attention if need_intermediates else None)
        records: tuple[Sequence[Tensor], Sequence[Tensor]] = (states, mids)
        if depth is not None:
            x = depth.finish(x, depth_state)
            records = (StateViews(states, depth.view), StateViews(mids, depth.view))
        return EncoderOutput(hidden=self.finish(x), padding_mask=key_padding_mask, states=records[0],
                             mids=records[1], attentions=attentions, embedded=embedded)

    def finish(self, x: Tensor) -> Tensor:
        return self.final_norm(x) if self.final_norm is not None else x

    def traffic(self, batch: int, length: int, width: int) -> dict[str, float]:
        """Bytes a training step must move for the attention maps this stack materialises
        (:func:`interlayer.accounting.step_cost`): a layer whose logits the next layer mixes in, or that mixes in the
        previous layer's, keeps a ``heads x T x T`` map (the lower triangle when causal), written once and read once
        forward, its gradient written once and read once backward."""
        maps = sum(1 for i, layer in enumerate(self.layers)
                   if self._logits_wanted[i][0] or getattr(layer.self_attn, "wants_prev_logits", False))
        heads = getattr(self.layers[0].self_attn, "n_heads", 0) if maps else 0
        cells = length * (length + 1) // 2 if self.causal else length * length
        return {"attention maps": 4.0 * width * batch * heads * cells * maps} if maps else {}

    def madds(self, t: int) -> int:
        return sum(layer.madds(t) for layer in self.layers) + (self.depth.madds(t) if self.depth is not None else 0)
