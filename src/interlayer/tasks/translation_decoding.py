"""Translation's decoding: batched greedy and beam search for encoder-decoder models, with or without the incremental
cache; ``greedy_from`` / ``beam_from`` start from an encoded source, for a model whose source is not token ids (the
captioner's regions).

Beam search follows fairseq's ``SequenceGenerator``: each step keeps the ``2k`` best extensions of the ``k``
beams; end-of-sentence candidates among the top ``k`` are finished with the score ``sum(log p) / len ** lenpen``
(``len`` counts the EOS), the best ``k`` others continue, and a sentence is done once it has ``k`` finished
hypotheses or reaches its length limit ``max_len_a * source_length + max_len_b`` (then its beams are forced to
end). The papers' IWSLT setting, beam 5 and length penalty 1.0, is the default.

With ``use_cache=False`` the decoder re-reads the whole prefix at every step; results are identical (tested) and
the option exists to measure what the cache buys.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from ..data.bpe import BOS_ID, EOS_ID, PAD_ID


@dataclass(frozen=True)
class DecodeOptions:
    """How the translation task decodes: beam width, fairseq's length penalty and length limit (``max_len_a *
    source length + max_len_b``), and whether the decoder keeps a KV cache."""

    beam: int = 5
    lenpen: float = 1.0
    max_len_a: float = 1.2
    max_len_b: int = 10
    use_cache: bool = True


def _length_limits(src: Tensor, model: nn.Module, options: DecodeOptions) -> Tensor:
    src_len = src.ne(PAD_ID).sum(1)
    limit = (src_len.float() * options.max_len_a + options.max_len_b).long()
    return limit.clamp(min=1, max=model.config.max_positions - 1)


def _step_logprobs(model: nn.Module, tokens: Tensor, memory: Tensor, memory_mask: Optional[Tensor], cache
                   ) -> Tensor:
    inputs = tokens[:, -1:] if cache is not None else tokens
    logits = model.decoder(inputs, memory, memory_mask, cache=cache).logits[:, -1]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    logprobs[:, PAD_ID] = -torch.inf
    logprobs[:, BOS_ID] = -torch.inf
    return logprobs


@torch.no_grad()
def greedy_decode(model: nn.Module, src: Tensor, options: DecodeOptions = DecodeOptions()) -> list[list[int]]:
    """Most likely token at each step; returns the generated ids without BOS/EOS, one list per sentence."""
    enc = model.encode(src)
    return greedy_from(model, enc.hidden, enc.padding_mask, _length_limits(src, model, options), options)


@torch.no_grad()
def greedy_from(model: nn.Module, memory: Tensor, memory_mask: Optional[Tensor], limits: Tensor,
                options: DecodeOptions = DecodeOptions()) -> list[list[int]]:
    """:func:`greedy_decode` from an encoded source (``memory`` (B, S, d), ``memory_mask`` True at padding or None)
    with a length limit per row (``limits`` (B,), EOS included): what a model whose source is not token ids (a
    captioner's regions) decodes with."""
    batch = memory.shape[0]
    tokens = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=memory.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=memory.device)
    cache = model.decoder.new_cache() if options.use_cache else None
    for step in range(int(limits.max())):
        logprobs = _step_logprobs(model, tokens, memory, memory_mask, cache)
        next_token = logprobs.argmax(-1)
        next_token = torch.where(step + 1 >= limits, torch.full_like(next_token, EOS_ID), next_token)
        next_token = next_token.masked_fill(finished, PAD_ID)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token.eq(EOS_ID)
        if finished.all():
            break
    return [[t for t in row[1:].tolist() if t not in (EOS_ID, PAD_ID)] for row in tokens]


@torch.no_grad()
def beam_search(model: nn.Module, src: Tensor, options: DecodeOptions = DecodeOptions()) -> list[list[int]]:
    """Best finished hypothesis per sentence (ids without BOS/EOS)."""
    enc = model.encode(src)
    return beam_from(model, enc.hidden, enc.padding_mask, _length_limits(src, model, options), options)


@torch.no_grad()
def beam_from(model: nn.Module, memory: Tensor, memory_mask: Optional[Tensor], limits: Tensor,
              options: DecodeOptions = DecodeOptions()) -> list[list[int]]:
    """:func:`beam_search` from an encoded source and per-row length limits (as :func:`greedy_from`)."""
    k = options.beam
    batch = memory.shape[0]
    device = memory.device
    expand = torch.arange(batch, device=device).repeat_interleave(k)
    memory = memory[expand]
    memory_mask = memory_mask[expand] if memory_mask is not None else None
    tokens = torch.full((batch * k, 1), BOS_ID, dtype=torch.long, device=device)
    scores = torch.zeros(batch, k, device=device)
    scores[:, 1:] = -torch.inf  # all beams start identical: expand only the first
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    cache = model.decoder.new_cache() if options.use_cache else None
    for step in range(int(limits.max())):
        logprobs = _step_logprobs(model, tokens, memory, memory_mask, cache)
        at_limit = (step + 1 >= limits).repeat_interleave(k)
        logprobs[at_limit] = torch.where(torch.arange(logprobs.shape[1], device=device) == EOS_ID,
                                         logprobs[at_limit], -torch.inf)
        vocab = logprobs.shape[1]
        candidates = (scores.view(-1, 1) + logprobs).view(batch, k * vocab)
        top_scores, top_index = candidates.topk(2 * k, dim=1)
        beam_of, token_of = top_index // vocab, top_index % vocab
        is_eos = token_of.eq(EOS_ID)
        for b, j in (is_eos[:, :k] & ~done[:, None]).nonzero().tolist():
            if len(finished[b]) < k:
                source_row = b * k + int(beam_of[b, j])
                hypothesis = tokens[source_row, 1:].tolist()
                finished[b].append((float(top_scores[b, j]) / (step + 1) ** options.lenpen, hypothesis))
        done |= torch.tensor([len(f) >= k for f in finished], device=device)
        if done.all():
            break
        # The best k non-EOS candidates continue (at most k of the 2k can be EOS, one per beam).
        rank = is_eos.long() * (2 * k) + torch.arange(2 * k, device=device)
        keep = rank.argsort(dim=1)[:, :k]
        scores = top_scores.gather(1, keep)
        rows = (torch.arange(batch, device=device)[:, None] * k + beam_of.gather(1, keep)).view(-1)
        tokens = torch.cat([tokens[rows], token_of.gather(1, keep).view(-1, 1)], dim=1)
        if cache is not None:
            cache.reorder(rows)
    return [max(f, key=lambda item: item[0])[1] if f else [] for f in finished]


def decode(model: nn.Module, src: Tensor, options: DecodeOptions = DecodeOptions()) -> list[list[int]]:
    """Beam search, or greedy when ``options.beam == 1``."""
    model.eval()
    return greedy_decode(model, src, options) if options.beam == 1 else beam_search(model, src, options)
