"""Sampling from a causal language model: greedy, temperature, top-k and top-p; batched prompts; the KV cache.

* **Choosing a token.** ``repetition_penalty`` p != 1 first divides the logit of every token already in the row
  (prompt included) by p where it is positive and multiplies it by p where negative (CTRL, Keskar et al. 2019,
  as ``transformers``' ``RepetitionPenaltyLogitsProcessor``). ``temperature=0`` is greedy (argmax). Otherwise the
  logits are divided by the temperature, cut to the ``top_k`` most likely tokens (Fan et al. 2018) and then to the smallest set whose
  probability reaches ``top_p`` (nucleus sampling, Holtzman et al. 2020), and a token is drawn from what is left,
  from ``generator`` when one is given (a seeded run is reproducible).
* **Batches of prompts of different lengths** come as one ``(B, T)`` tensor and a ``padding_mask`` (True at
  padding), padded on the left, on the right, or anywhere: each row's real tokens are first moved, in order, to
  the end of the row (left padding), so every row's next token is read from the last column and appended after
  it. The padding is a key mask, and with absolute positions ``position_ids`` number each row's real tokens
  0, 1, ..., so every row is continued exactly as it would be alone (tested, for right- and left-padded input).
  Rotary and relative positions depend on offsets only, which left padding does not change.
* **The cache.** With ``use_cache`` (default: whenever the model supports it) the prompt is read once and then
  one token per step with the layers' :class:`~interlayer.core.attention.KVCache`; the logits equal those of the
  full forward pass (tested). Past ``max_positions`` tokens the context slides as in nanoGPT: each step re-reads
  the last ``max_positions`` tokens, numbered from 0, without the cache.
* **Its size.** :func:`kv_cache_bytes_per_token` measures what the cache holds per token of one sequence (methods
  that share keys/values across layers keep fewer tensors: a layer that reuses another's stores nothing).
* **Stopping** after ``max_new_tokens``, or once every row has produced ``eos_id``; a row that stopped early is
  filled with ``eos_id`` and ``Generation.lengths`` says how many tokens (EOS included) it produced.
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .lm import CausalLM


@dataclass(frozen=True)
class SamplingOptions:
    max_new_tokens: int = 100
    temperature: float = 1.0  # 0: greedy decoding
    top_k: int = 0  # > 0: sample among the k most likely tokens only (all of them when k exceeds the vocabulary)
    top_p: float = 1.0  # < 1: sample among the smallest set of tokens whose probability reaches top_p
    eos_id: Optional[int] = None  # a row stops once it has produced this token
    use_cache: Optional[bool] = None  # None: the KV cache whenever the model supports it
    repetition_penalty: float = 1.0  # > 1 makes tokens already in the row less likely (1: off)

    def validate(self, vocab_size: int) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must not be negative")
        if not 0 <= self.temperature < math.inf:  # NaN fails every comparison
            raise ValueError(f"temperature={self.temperature} must be a finite number >= 0 (0 is greedy decoding)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 switches it off; above the vocabulary of "
                             f"{vocab_size} it keeps every token)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must lie in (0, 1] (1 switches it off)")
        if not 0 < self.repetition_penalty < math.inf:
            raise ValueError(f"repetition_penalty={self.repetition_penalty} must be a finite number > 0 (1 switches "
                             "it off)")
        if self.eos_id is not None and not 0 <= self.eos_id < vocab_size:
            raise ValueError(f"eos_id={self.eos_id} is not a token id of this model (0..{vocab_size - 1})")


@dataclass
class Generation:
    tokens: Tensor  # (B, N) the new tokens; after a row's eos_id, eos_id again
    lengths: Tensor  # (B,) how many of them each row produced, its eos_id included


def left_align(tokens: Tensor, padding_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Move each row's real tokens, in order, to the end of the row (a stable sort of the mask)."""
    order = torch.sort((~padding_mask).to(torch.uint8), dim=1, stable=True).indices
    return tokens.gather(1, order), padding_mask.gather(1, order)


def position_ids(padding_mask: Tensor) -> Tensor:
    """Absolute positions of left-aligned rows: the real tokens are 0, 1, ... (padding gets 0, never read)."""
    return ((~padding_mask).long().cumsum(1) - 1).clamp_min(0)


def apply_repetition_penalty(scores: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """``scores`` (B, V) with the entries of the tokens in ``seen`` (B, T) divided by ``penalty`` where positive,
    multiplied where negative (``transformers``' ``RepetitionPenaltyLogitsProcessor``, in float32)."""
    scores = scores.float()
    picked = scores.gather(1, seen)
    return scores.scatter(1, seen, torch.where(picked < 0, picked * penalty, picked / penalty))


def choose_tokens(logits: Tensor, options: SamplingOptions, generator: Optional[torch.Generator] = None,
                  seen: Optional[Tensor] = None) -> Tensor:
    """One token per row of ``logits`` (B, V), as the options say (module docstring); ``seen`` (B, T): the rows'
    tokens so far, which the repetition penalty reads."""
    if options.repetition_penalty != 1.0 and seen is not None:
        logits = apply_repetition_penalty(logits, seen, options.repetition_penalty)
    if options.temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / options.temperature
    lowest = torch.finfo(logits.dtype).min
    if options.top_k:
        kth = torch.topk(logits, min(options.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, lowest)
    if options.top_p < 1:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        # drop a token when the more likely ones already reach top_p (the most likely one always stays)
        drop = (probs.cumsum(-1) - probs) >= options.top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), lowest)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.no_grad()
def generate(model: "CausalLM", prompts: Tensor, options: SamplingOptions = SamplingOptions(), *,
             padding_mask: Optional[Tensor] = None, generator: Optional[torch.Generator] = None) -> Generation:
    """Continue each row of ``prompts`` (B, T) by up to ``options.max_new_tokens`` tokens (eval mode; the
    model's mode is restored afterwards)."""
    vocab = model.lm_head.out_features
    options.validate(vocab)
    if prompts.dim() != 2 or prompts.shape[1] == 0:
        raise ValueError(f"prompts must be a (batch, length) tensor of token ids with length >= 1, got shape "
                         f"{tuple(prompts.shape)}")
    if padding_mask is None:
        padding_mask = torch.zeros_like(prompts, dtype=torch.bool)
    if padding_mask.shape != prompts.shape:
        raise ValueError(f"padding_mask {tuple(padding_mask.shape)} must have the prompts' shape "
                         f"{tuple(prompts.shape)}")
    empty = padding_mask.all(1)
    if bool(empty.any()):
        raise ValueError(f"prompt(s) {empty.nonzero().flatten().tolist()} are all padding; every row needs at least "
                         "one token to continue")
    use_cache = model.supports_cache if options.use_cache is None else options.use_cache
    if use_cache:
        model.new_cache()  # raises the reason when the model cannot be cached
    padded = bool(padding_mask.any())
    tokens, mask = left_align(prompts, padding_mask) if padded else (prompts, padding_mask)
    context = model.max_positions
    cache = model.new_cache() if use_cache and tokens.shape[1] <= context else None
    finished = torch.zeros(len(tokens), dtype=torch.bool, device=tokens.device)
    lengths = torch.zeros(len(tokens), dtype=torch.long, device=tokens.device)
    new: list[Tensor] = []
    was_training = model.training
    model.eval()
    try:
        for _ in range(options.max_new_tokens):
            if cache is not None and tokens.shape[1] <= context:
                fresh = tokens[:, cache[0].length:]  # the whole prompt first, then the last token
                logits = model(fresh, padding_mask=mask if padded else None, cache=cache,
                               position_ids=position_ids(mask)[:, -fresh.shape[1]:] if padded else None).logits
            else:
                cache = None
                window = mask[:, -context:]
                logits = model(tokens[:, -context:], padding_mask=window if padded else None,
                               position_ids=position_ids(window) if padded else None).logits
            chosen = choose_tokens(logits[:, -1], options, generator, seen=tokens)
            if options.eos_id is not None:
                chosen = chosen.masked_fill(finished, options.eos_id)
            lengths += (~finished).long()
            new.append(chosen)
            tokens = torch.cat([tokens, chosen[:, None]], dim=1)
            mask = torch.cat([mask, torch.zeros_like(chosen[:, None], dtype=torch.bool)], dim=1)
            if options.eos_id is not None:
                finished |= chosen == options.eos_id
                if bool(finished.all()):
                    break
    finally:
        model.train(was_training)
    out = torch.stack(new, dim=1) if new else prompts.new_zeros((len(prompts), 0))
    return Generation(tokens=out, lengths=lengths)


@torch.no_grad()
def kv_cache_bytes_per_token(model: "CausalLM", tokens: int = 4) -> int:
    """Bytes of keys and values the model's cache holds per token of one sequence, measured: ``tokens`` tokens are
    read with a fresh cache (``model.new_cache()``) in the parameters' dtype, and the bytes every layer keeps
    (:attr:`~interlayer.core.attention.KVCache.nbytes`) are divided by ``tokens``. For a plain model this is
    ``layers x (qk_dim + d_model) x bytes per number``."""
    cache = model.new_cache()
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        model(torch.zeros((1, tokens), dtype=torch.long, device=device), cache=cache)
    finally:
        model.train(was_training)
    total = sum(layer.nbytes for layer in cache)
    return total // tokens
