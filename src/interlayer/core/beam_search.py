"""Beam search for the causal language model, as ``transformers``' ``generate(num_beams=k)`` computes it.

The algorithm is ``GenerationMixin._beam_search`` of ``transformers`` (the vectorised version since 4.50, in
``generation/utils.py``), step for step, so that an imported GPT-2 returns the same tokens (tested against
``transformers`` 5):

* every prompt is repeated ``k`` times; all beams but the first start at score ``-1e9``, so the first step
  expands one beam only. Each step adds the next token's log-softmax (after the repetition penalty, if any) to the
  running scores and keeps the ``2k`` best continuations over all ``k * V`` candidates (``max(2, 1 + #EOS) * k``);
* a continuation that ends (it produced EOS, or reached ``max_length`` = prompt + ``max_new_tokens``) is a
  finished hypothesis when it is among the top ``k`` of those ``2k``: its score is divided by
  ``generated_length ** length_penalty`` (the generated tokens only, EOS included) and it replaces the worst of
  the ``k`` finished ones if better; the ``k`` best continuations that did not end run on;
* ``early_stopping``: ``True`` stops a prompt once it has ``k`` finished hypotheses; ``False`` (the default)
  stops it when the best running score, divided by the current generated length to the ``length_penalty``,
  cannot beat the worst finished one (``transformers``' heuristic); ``"never"`` uses ``max_length`` there when
  ``length_penalty > 0`` (the canonical beam search);
* the result is the ``num_return_sequences`` best finished hypotheses per prompt, padded with ``pad_token_id``
  (or EOS) to the longest, and their scores.

The KV cache follows the surviving beams (:meth:`~interlayer.core.attention.KVCache.reorder`); a model that has
no cache (Multi-Pass) re-reads the sequences each step. Prompts may be padded anywhere: they are left-aligned
and numbered as :func:`~interlayer.core.generation.generate` does, and come back as given. Beam *sampling*
(``do_sample=True``) is not implemented.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .generation import CausalModel, apply_repetition_penalty, counted, left_align, position_ids, uncounted_positions

NEG = -1.0e9  # transformers' "impossible" score


@dataclass
class BeamSearchResult:
    sequences: Tensor  # (B * num_return_sequences, prompt + longest returned continuation)
    scores: Tensor  # (B * num_return_sequences,) summed log-probabilities / generated_length ** length_penalty


def _gather(tensor: Tensor, index: Tensor) -> Tensor:
    """``tensor[b, index[b, j], ...]``: beams selected per prompt (``(B, beams, ...)`` by ``(B, n)``)."""
    while index.dim() < tensor.dim():
        index = index.unsqueeze(-1)
    return torch.take_along_dim(tensor, index, dim=1)


@torch.no_grad()
def beam_search(model: CausalModel, prompts: Tensor, *, num_beams: int, max_new_tokens: int,
                padding_mask: Optional[Tensor] = None, eos_token_id: Optional[int] = None,
                pad_token_id: Optional[int] = None, length_penalty: float = 1.0,
                early_stopping: Union[bool, str] = False, num_return_sequences: int = 1,
                repetition_penalty: float = 1.0, use_cache: Optional[bool] = None) -> BeamSearchResult:
    """The ``num_return_sequences`` best of ``num_beams`` hypotheses per prompt (module docstring); the model runs
    in eval mode and its mode is restored."""
    if prompts.dim() != 2 or prompts.shape[1] == 0:
        raise ValueError(f"prompts must be a (batch, length) tensor of token ids with length >= 1, got shape "
                         f"{tuple(prompts.shape)}")
    if not 1 <= num_return_sequences <= num_beams:
        raise ValueError(f"num_return_sequences={num_return_sequences} must lie in 1..num_beams={num_beams}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 1 for beam search")
    batch, prompt_len = prompts.shape
    max_length = prompt_len + max_new_tokens
    if max_length > model.max_positions:
        raise ValueError(f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                         f"max_positions={model.max_positions}; beam search does not slide the context window")
    mask = torch.zeros_like(prompts, dtype=torch.bool) if padding_mask is None else padding_mask
    if mask.shape != prompts.shape:
        raise ValueError(f"padding_mask {tuple(mask.shape)} must have the prompts' shape {tuple(prompts.shape)}")
    padded = bool(mask.any())
    if padded and bool(mask.all(1).any()):
        raise ValueError("a prompt is all padding; every row needs at least one token to continue")
    uncounted = uncounted_positions(mask, max_length).repeat_interleave(num_beams, dim=0) \
        if padded and repetition_penalty != 1.0 else None
    tokens, mask = left_align(prompts, mask) if padded else (prompts, mask)
    device = prompts.device
    flat = tokens.repeat_interleave(num_beams, dim=0)
    mask = mask.repeat_interleave(num_beams, dim=0)
    keep = max(2, 1 + (eos_token_id is not None)) * num_beams
    top_mask = torch.arange(keep, device=device) < num_beams
    fill = (pad_token_id or eos_token_id) if eos_token_id is not None else -1  # transformers' output_fill_value
    running = torch.full((batch, num_beams, max_length), fill, dtype=torch.long, device=device)
    running[:, :, :prompt_len] = flat.view(batch, num_beams, prompt_len)
    finished = running.clone()
    running_scores = torch.zeros((batch, num_beams), device=device)
    running_scores[:, 1:] = NEG
    finished_scores = torch.full((batch, num_beams), NEG, device=device)
    finished_lengths = torch.zeros((batch, num_beams), dtype=torch.long, device=device)
    is_finished = torch.zeros((batch, num_beams), dtype=torch.bool, device=device)
    improvable = torch.ones((batch, 1), dtype=torch.bool, device=device)
    offsets = torch.arange(batch, device=device)[:, None] * num_beams
    use_cache = model.supports_cache if use_cache is None else use_cache
    cache = model.new_cache() if use_cache else None
    was_training = model.training
    model.eval()
    try:
        for cur_len in range(prompt_len, max_length):
            sequences = running[:, :, :cur_len].reshape(batch * num_beams, cur_len)
            step_mask = torch.cat([mask, mask.new_zeros((len(mask), cur_len - prompt_len))], dim=1)
            fresh = sequences[:, cache[0].length:] if cache is not None else sequences
            positions = position_ids(step_mask)[:, -fresh.shape[1]:] if padded else None
            logits = model(fresh, padding_mask=step_mask if padded else None, cache=cache,
                           position_ids=positions).logits[:, -1].float()
            log_probs = F.log_softmax(logits, dim=-1)
            if repetition_penalty != 1.0:
                log_probs = apply_repetition_penalty(log_probs, counted(sequences, uncounted, log_probs.shape[-1]),
                                                     repetition_penalty)
            vocab = log_probs.shape[-1]
            scores = (log_probs.view(batch, num_beams, vocab) + running_scores[:, :, None]).view(batch, -1)
            # c. the best `keep` continuations over all beams
            top_scores, top_index = torch.topk(scores, k=keep)
            source = top_index // vocab
            candidates = _gather(running, source)
            candidates[:, :, cur_len] = top_index % vocab
            # d. which of them end here
            ends = torch.full_like(top_scores, cur_len + 1 >= max_length, dtype=torch.bool)
            if eos_token_id is not None:
                ends |= candidates[:, :, cur_len] == eos_token_id
            # e. the best num_beams that do not end run on
            alive = torch.topk(top_scores + ends.float() * NEG, k=num_beams).indices
            running = _gather(candidates, alive)
            running_scores = _gather(top_scores + ends.float() * NEG, alive)
            # f. finished hypotheses: the top num_beams that end, scored by length, merged with the kept ones
            generated = cur_len + 1 - prompt_len
            just_finished = ends & top_mask[None, :]
            final = top_scores / (generated ** length_penalty)
            final = final + (is_finished.all(-1, keepdim=True) & (early_stopping is True)).float() * NEG
            final = final + (~improvable).float() * NEG + (~just_finished).float() * NEG
            merged_scores = torch.cat([finished_scores, final], dim=1)
            best = torch.topk(merged_scores, k=num_beams).indices
            finished = _gather(torch.cat([finished, candidates], dim=1), best)
            finished_scores = _gather(merged_scores, best)
            finished_lengths = _gather(torch.cat([finished_lengths, torch.full_like(final, generated,
                                                                                      dtype=torch.long)], 1), best)
            is_finished = _gather(torch.cat([is_finished, just_finished], dim=1), best)
            if cache is not None:
                for layer in cache:
                    layer.reorder((_gather(source, alive) + offsets).flatten())
            # g. can this prompt still improve? (transformers' _check_early_stop_heuristic)
            length = (max_length if early_stopping == "never" and length_penalty > 0.0 else cur_len + 1) - prompt_len
            best_running = running_scores[:, :1] / (length ** length_penalty)
            worst_finished = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True).values, NEG)
            improvable = improvable & (best_running > worst_finished).any(dim=-1, keepdim=True)
            open_beam = not (bool(is_finished.all()) and early_stopping is True)
            if not (bool(improvable.any()) and open_beam and not bool(ends.all())):
                break
    finally:
        model.train(was_training)
    returned = finished[:, :num_return_sequences].reshape(batch * num_return_sequences, max_length)
    length = prompt_len + int(finished_lengths[:, :num_return_sequences].max())
    returned = returned[:, :length]
    returned[:, :prompt_len] = prompts.repeat_interleave(num_return_sequences, dim=0)
    return BeamSearchResult(sequences=returned, scores=finished_scores[:, :num_return_sequences].flatten())
