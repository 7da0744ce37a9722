"""A decoder-only causal language model (GPT; Radford et al. 2018/2019) on the core's encoder stack.

Design (why it is built this way):

* **The body is the core :class:`Encoder`, run causally.** A decoder-only layer is an encoder layer with a causal
  mask: self-attention and feed-forward, no cross-attention. Reusing :class:`Encoder` (with ``causal`` set from
  ``arch="causal_lm"``) means every method reaches the language model through the factories and hooks it already
  uses: Crossformer ties and regularises ``encoder.layers``, LW replaces the self-attention and FFN factories,
  Predictive Attention receives ``prev_logits`` and Multi-Pass wraps the stack (``encoder_class``). The stack
  therefore keeps the name ``encoder``: parameter names are ``encoder.embed.tokens.weight`` (GPT-2's ``wte``),
  ``encoder.embed.positions.weight`` (``wpe``, learned positions), ``encoder.layers.N.self_attn.{q,k,v,out}_proj``,
  ``encoder.layers.N.ffn.{fc1,fc2}``, ``encoder.layers.N.{attn_block,ffn_block}.norm``, ``encoder.final_norm`` and
  ``lm_head.weight`` (the token table itself when tied, stored once in checkpoints).
* **Token table** without a padding row (a language model has no padding *token*: padding in a batch of prompts is
  a mask), initialised N(0, 0.02) as GPT-2 and nanoGPT do; the presets read it unscaled (``embed_scale=False``).
* **Causal and incremental.** :meth:`CausalLM.forward` reads a whole sequence (training, scoring) or, with a cache
  from :meth:`new_cache` (one :class:`KVCache` per layer), only the new positions; the logits are the same
  (tested). Padding is a mask over keys (``padding_mask``, True at padding); with left padding, ``position_ids``
  give each row's real tokens the positions 0, 1, ... (see :mod:`interlayer.core.generation`).
* **MAdds** count the full ``T x T`` attention products, as the encoder does (the causal mask makes about half of
  them unnecessary, but the eager path and most kernels compute them), plus the output projection.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from .attention import KVCache
from .components import Components
from .config import TransformerConfig
from .encoder import Encoder, EncoderOutput
from .generation import Generation, SamplingOptions, generate
from .hf_generation import GenerateOutput, generate_like_hf
from .hub import PretrainedMixin, track_ties
from .losses import labels_loss
from .outputs import HFOutputMixin, attentions, hidden_states, one_of, padding_from


@dataclass
class CausalLMOutput(HFOutputMixin):
    """What the language model returns: next-token logits (per exit too, for multi-exit training), the stack's output,
    auxiliary losses, and the Hugging Face extras asked for by keyword (the loss with ``labels``)."""

    logits: Tensor  # (B, T, V): next-token logits at every position given
    encoder: EncoderOutput  # the stack's output (hidden states, per-layer attentions on request)
    exit_logits: Optional[list[Tensor]] = None  # one per stack exit when the stack has several (Multi-Pass)
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    loss: Optional[Tensor] = None  # with ``labels``: the shifted next-token loss + exits + aux losses (training mode)
    lm_loss: Optional[Tensor] = None  # with ``labels``: the shifted next-token cross-entropy alone (perplexity's)
    hidden_states: Optional[tuple[Tensor, ...]] = None  # with ``output_hidden_states``
    attentions: Optional[tuple[Tensor, ...]] = None  # with ``output_attentions``


class CausalLM(nn.Module, PretrainedMixin):
    """Token embedding (+ absolute positions, if configured), ``enc_layers`` causal layers, final LayerNorm
    (pre-LN), and a linear head onto the vocabulary, tied to the token table when ``cfg.tie_output``.
    ``save_pretrained``/``from_pretrained`` as every interlayer model (a GPT-2 folder imports)."""

    def __init__(self, cfg: TransformerConfig, components: Components) -> None:
        super().__init__()
        tokens = nn.Embedding(cfg.src_vocab_size, cfg.d_model)
        nn.init.normal_(tokens.weight, std=0.02)
        encoder_class = components.encoder_class or Encoder
        self.encoder = encoder_class(cfg, components, tokens)
        self.lm_head = nn.Linear(cfg.d_model, cfg.src_vocab_size, bias=False)
        if cfg.tie_output:
            self.lm_head.weight = tokens.weight
        else:
            nn.init.normal_(self.lm_head.weight, std=0.02)
        self.max_positions = cfg.max_positions
        self.aux_loss_fns: dict = {}
        track_ties(self)  # each tied tensor once in state dicts

    @property
    def supports_cache(self) -> bool:
        """Whether incremental decoding applies: the cached path runs the stack once (``run_layers``), which is
        what the plain encoder's ``process`` does; an encoder that runs it otherwise (Multi-Pass: one run per pass,
        each needing its own keys and values) is read without a cache."""
        return type(self.encoder).process is Encoder.process

    def new_cache(self, capacity: Optional[int] = None) -> list[KVCache]:
        """One :class:`KVCache` per layer: growing, or with ``capacity`` static (allocated for that many positions
        at the first step and written in place; :mod:`interlayer.core.generation`)."""
        if not self.supports_cache:
            raise ValueError(f"{type(self.encoder).__name__} runs the layer stack more than once per forward pass "
                             "(Multi-Pass), so one key/value cache per layer cannot hold its state; generate with "
                             "use_cache=False")
        if capacity is not None and not 0 < capacity <= self.max_positions:
            raise ValueError(f"capacity={capacity} must lie in 1..max_positions={self.max_positions}")
        return [KVCache(capacity=capacity) for _ in self.encoder.layers]

    def compute_aux_losses(self) -> dict[str, Tensor]:
        return {name: fn(self) for name, fn in self.aux_loss_fns.items()}

    # -- transformers' names for the token table, the head and the generation defaults --------------------------
    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed.tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Replace the token table; a tied head (``tie_output``) becomes the new table's weight too."""
        self.encoder.embed.tokens = value
        if self.config.tie_output:
            head = nn.Linear(value.embedding_dim, value.num_embeddings, bias=False, device="meta")
            head.weight = value.weight
            self.lm_head = head

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    @property
    def generation_config(self) -> Any:
        """A ``transformers.GenerationConfig`` holding the model's generation defaults (its config's
        ``bos``/``eos``/``pad_token_id``), made when first asked for; set it, or change its fields, to change what
        :meth:`generate` does without options. Needs ``transformers`` (an ImportError without it)."""
        if "_generation_config" not in self.__dict__:
            try:
                from transformers import GenerationConfig
            except ImportError:
                raise ImportError("generation_config is a transformers.GenerationConfig, and transformers is not "
                                  "installed; pass generate's options directly") from None
            cfg = self.config
            self.__dict__["_generation_config"] = GenerationConfig(
                bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id)
        return self.__dict__["_generation_config"]

    @generation_config.setter
    def generation_config(self, value: Any) -> None:
        self.__dict__["_generation_config"] = value

    def generation_defaults(self) -> dict[str, Any]:
        """What :meth:`generate` takes when the call does not say: the config's special token ids, then whatever
        :attr:`generation_config` sets once it exists (without importing ``transformers`` before that)."""
        cfg = self.config
        defaults = {key: getattr(cfg, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")
                    if getattr(cfg, key) is not None}
        stored = self.__dict__.get("_generation_config")
        if stored is not None:
            defaults.update(stored.to_diff_dict() if hasattr(stored, "to_diff_dict") else dict(stored))
        return defaults

    def forward(self, tokens: Optional[Tensor] = None, *, input_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                padding_mask: Optional[Tensor] = None, position_ids: Optional[Tensor] = None,
                cache: Optional[list[KVCache]] = None, need_intermediates: bool = False,
                output_hidden_states: bool = False, output_attentions: bool = False,
                use_cache: Optional[bool] = None, return_dict: Optional[bool] = None
                ) -> Union[CausalLMOutput, tuple[Tensor, ...]]:
        """``tokens`` (B, T) or ``input_ids``: the sequence, or with ``cache`` only the positions not yet seen.

        ``padding_mask`` (B, cached + T), True at padding, hides those keys (``attention_mask``, HF's form, is its
        negation: 1 where a token is read); ``position_ids`` (B, T) replace the absolute positions
        ``offset .. offset + T - 1`` (left-padded rows). Without a cache and with padding, a padded query row
        attends to nothing and outputs zeros (its logits are meaningless and must be ignored); the ids at padded
        positions are never read, so they may be anything (a character tokenizer's ``[PAD]``, past the table).
        ``labels`` (B, T), usually the input ids with -100 where no loss is wanted, give ``output.loss``: position
        t's logits against label t + 1, as GPT2LMHeadModel and the ``lm`` task compute it, plus, in training mode
        only, the aux losses and the other exits' losses (:func:`~interlayer.core.losses.labels_loss`), and
        ``output.lm_loss``, that cross-entropy alone in either mode.

        ``transformers``' ``return_dict=False`` returns :meth:`~CausalLMOutput.to_tuple` (the loss first when
        labels are given); ``use_cache`` is accepted and changes nothing here: the key/value cache is interlayer's
        ``cache`` argument (``new_cache()``), which :meth:`generate` fills itself.
        """
        tokens = one_of(tokens, input_ids, "tokens", "input_ids")
        padding_mask = padding_from(attention_mask, padding_mask)
        if padding_mask is not None:  # never read: any id may stand there (a tokenizer's [PAD] past the table)
            tokens = tokens.masked_fill(padding_mask[:, -tokens.shape[1]:], 0)
        need_intermediates = need_intermediates or output_attentions
        offset = cache[0].length if cache else 0
        x = self.encoder.embed(tokens, offset=offset, position_ids=position_ids)
        if cache is None:
            enc = self.encoder.process(x, padding_mask, need_intermediates=need_intermediates)
        else:
            if len(cache) != len(self.encoder.layers) or not self.supports_cache:
                self.new_cache()  # raises the reason for a stack that cannot be cached
                raise ValueError(f"cache has {len(cache)} entries; the model has {len(self.encoder.layers)} layers "
                                 "(make it with model.new_cache())")
            enc = self.encoder.run_layers(x, padding_mask, cache=cache, need_intermediates=need_intermediates)
        logits = self.lm_head(enc.hidden)
        exit_logits = None
        if enc.exits is not None:
            exit_logits = [logits if e is enc.hidden else self.lm_head(e) for e in enc.exits]
        out = CausalLMOutput(logits=logits, encoder=enc, exit_logits=exit_logits,
                             aux_losses=self.compute_aux_losses(),
                             hidden_states=hidden_states(enc) if output_hidden_states else None,
                             attentions=attentions(enc) if output_attentions else None)
        if labels is not None:
            out.loss, out.lm_loss = labels_loss(out, labels, shift=True, training=self.training)
        return out.to_tuple() if return_dict is False else out

    def generate(self, input_ids: Optional[Tensor] = None, options: Optional[SamplingOptions] = None, *,
                 attention_mask: Optional[Tensor] = None, padding_mask: Optional[Tensor] = None,
                 generator: Optional[torch.Generator] = None, prompts: Optional[Tensor] = None,
                 **hf_options: Any) -> Union[Tensor, Generation, GenerateOutput]:
        """Continue every prompt, in one of two forms.

        * Typed: ``generate(prompts, SamplingOptions(...), padding_mask=...)`` returns a :class:`Generation`
          (the new tokens and each row's length): :func:`interlayer.core.generation.generate`.
        * Hugging Face's: ``generate(input_ids, attention_mask=..., max_new_tokens=..., do_sample=...,
          num_beams=..., repetition_penalty=..., generation_config=..., return_dict_in_generate=..., ...)``
          returns the prompts followed by their continuations, as ``transformers`` does, over the model's
          :meth:`generation_defaults`: :func:`interlayer.core.hf_generation.generate_like_hf`.
        """
        tokens = one_of(input_ids, prompts, "input_ids", "prompts")
        if options is not None:
            if hf_options or attention_mask is not None:
                given = sorted(hf_options) + (["attention_mask"] if attention_mask is not None else [])
                raise TypeError(f"generate takes a SamplingOptions or Hugging Face keyword arguments, not both "
                                f"(got a SamplingOptions and {given}); put the settings in the SamplingOptions")
            return generate(self, tokens, options, padding_mask=padding_mask, generator=generator)
        return generate_like_hf(self, tokens, padding_mask=padding_from(attention_mask, padding_mask),
                                generator=generator, **hf_options)

    def traffic(self, batch: int, length: int, width: int) -> dict[str, float]:
        """Bytes a training step must move for the logits (:func:`interlayer.accounting.step_cost`): written by the
        output layer, read by the loss, their gradient written and read back (the loss fused with them, as the
        compiled step does it), plus the embedding's output and its gradient (fp32)."""
        tokens = batch * length
        return {"logits": 4.0 * width * tokens * self.lm_head.out_features,
                "embedding": 8.0 * tokens * self.lm_head.in_features}

    def madds(self, src_len: int, tgt_len: Optional[int] = None) -> int:
        """Multiply-adds of one forward pass over ``src_len`` tokens: the stack and the output projection."""
        return self.encoder.madds(src_len) + src_len * self.lm_head.in_features * self.lm_head.out_features

