"""Sampling from a causal language model: greedy, temperature, top-k and top-p; batched prompts; the KV cache.

* **Choosing a token.** ``repetition_penalty`` p != 1 first divides the logit of every token already in the row (prompt
  included) by p where it is positive and multiplies it by p where negative (CTRL, Keskar et al. 2019, as
  ``transformers``' ``RepetitionPenaltyLogitsProcessor``). A padded prompt's leading padding is not counted (as
  ``transformers`` 5's ``generate``, whose ``prompt_ignore_length`` is the attention mask's leading zeros: a pad id
  that is a real token, pad = EOS, is not penalised for it), padding after the first real token is, and an id
  outside the vocabulary is never penalised (:func:`apply_repetition_penalty`). ``temperature=0`` is greedy
  (argmax). Otherwise the logits are divided by the temperature, cut to the ``top_k`` most likely tokens (Fan et al.
  2018) and then to the smallest set whose probability reaches ``top_p`` (nucleus sampling, Holtzman et al. 2020),
  and a token is drawn from what is left, from ``generator`` when one is given (a seeded run is reproducible).
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
* **A static cache** (``static_cache``, the default): the cache is allocated once for the prompt and the new
  tokens and written in place (no ``torch.cat`` per token, no cache memory allocated per step); attention reads
  the positions written, so the tokens are those of the growing cache (``static_cache=False``) and of
  recomputing (tested). Predictive Attention's causal mixer keeps its convolution input rows in the cache's
  ``state``, whose width grows with the keys (they are a few rows per layer): that state keeps growing.
* **A compiled step** (``compile``): the one-token step is compiled with ``torch.compile`` for the batch size and
  a cache capacity (the prompt plus the new tokens, rounded up to a multiple of :data:`CAPACITY_STEP` positions
  and at most ``max_positions``), over a fixed-shape cache: every step attends to the whole capacity (the
  causal mask hides what is not written yet) and reads its position from a device tensor, so the shapes never
  change and, on a GPU, the step is captured and replayed as a CUDA graph (``mode="reduce-overhead"``), which
  removes Python and kernel-launch overhead, the cost that dominates decoding a small model. The compiled step,
  its cache and buffers are kept with the model and reused by the next call of the same shapes (one per model:
  other shapes replace it, :func:`release_compiled_step` drops it; each shape compiles once, within
  ``torch._dynamo.config.recompile_limit``). Off by
  default: compiling takes seconds to minutes, worth it for long or repeated generation. A logit mixer
  (Predictive Attention) has a state that grows with the keys, so it cannot be compiled this way and is refused
  with the reason (its static cache still applies).
* **No host synchronisation per step**: the loop keeps positions, lengths and the stopping flags on the device;
  the host reads them only every ``stop_check_interval`` tokens to stop once every row has produced ``eos_id``
  (a few steps may run past the last EOS; the result is cut where stopping at once would have left it).
* **Its size.** :func:`kv_cache_bytes_per_token` measures what the cache holds per token of one sequence (methods
  that share keys/values across layers keep fewer tensors: a layer that reuses another's stores nothing).
* **Stopping** after ``max_new_tokens``, or once every row has produced ``eos_id``; a row that stopped early is
  filled with ``eos_id`` and ``Generation.lengths`` says how many tokens (EOS included) it produced.

The loop (:func:`generate`) asks a *decoder* for the next-token logits, first after the prompt
(:meth:`TokenDecoder.first`) and then after each chosen token (:meth:`TokenDecoder.next`); the decoders are recomputing
(:class:`Recompute`), cached (:class:`Cached`, static or growing) and compiled (:class:`Compiled`), and another
search (beam search) can drive them the same way.
"""
from __future__ import annotations

import abc
import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Protocol, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import KVCache

CAPACITY_STEP = 64  # a compiled step's cache capacity is a multiple of this: nearby lengths share one compilation


class CausalModel(Protocol):
    """What generation reads of a causal language model (:class:`~interlayer.core.lm.CausalLM`). ``core/lm.py``
    imports this module (and :mod:`.hf_generation`, :mod:`.beam_search`), so they name the model by what they use
    of it rather than import it back: the package has no import circle, ``TYPE_CHECKING`` imports included."""

    encoder: nn.Module  # the stack: its ``layers`` (a predictive mixer's kernel decides the compiled decoder)
    lm_head: nn.Linear
    max_positions: int
    supports_cache: bool
    training: bool

    def __call__(self, input_ids: Tensor, **kwargs: Any) -> Any: ...

    def new_cache(self, capacity: Optional[int] = None) -> list[KVCache]: ...

    def generation_defaults(self) -> dict[str, Any]: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...

    def eval(self) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...


@dataclass(frozen=True)
class SamplingOptions:
    """How :func:`generate` picks tokens and how long it goes on: the length, temperature (0: greedy), top-k, top-p,
    repetition penalty, the end-of-sequence id, and whether to use the KV cache (None: when the model supports one) and
    a compiled step."""

    max_new_tokens: int = 100
    temperature: float = 1.0  # 0: greedy decoding
    top_k: int = 0  # > 0: sample among the k most likely tokens only (all of them when k exceeds the vocabulary)
    top_p: float = 1.0  # < 1: sample among the smallest set of tokens whose probability reaches top_p
    eos_id: Optional[int] = None  # a row stops once it has produced this token
    use_cache: Optional[bool] = None  # None: the KV cache whenever the model supports it
    static_cache: bool = True  # the cache allocated once and written in place (False: grown by concatenation)
    compile: bool = False  # the one-token step compiled for fixed shapes (CUDA graphs on a GPU); module docstring
    compile_backend: Union[str, Callable[..., Any]] = "inductor"  # torch.compile's (for ``compile``; "eager":
    # dynamo's trace alone, which the CPU tests use)
    stop_check_interval: int = 16  # with eos_id: tokens between the host's checks whether every row has stopped
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
        if self.stop_check_interval < 1:
            raise ValueError(f"stop_check_interval={self.stop_check_interval} must be >= 1 (1 checks after every "
                             "token)")
        if self.compile and (self.use_cache is False or not self.static_cache):
            raise ValueError(f"compile=True compiles the step over a static KV cache, but use_cache="
                             f"{self.use_cache} and static_cache={self.static_cache}; keep the static cache or "
                             "set compile=False")


@dataclass
class Generation:
    """The prompts followed by their continuations, and how many tokens each row produced (EOS included)."""

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
    multiplied where negative (``transformers``' ``RepetitionPenaltyLogitsProcessor``, in float32). An id of ``seen``
    at or above V (a position left uncounted, :func:`uncounted_positions`, or a pad id outside the vocabulary)
    penalises nothing: it lands in a column added for it and dropped, as ``transformers`` does."""
    vocab = scores.shape[-1]
    scores = F.pad(scores.float(), (0, 1))
    seen = seen.clamp(max=vocab)
    picked = scores.gather(1, seen)
    return scores.scatter(1, seen, torch.where(picked < 0, picked * penalty, picked / penalty))[:, :vocab]


def uncounted_positions(padding_mask: Tensor, columns: int) -> Tensor:
    """(B, ``columns``) True at the positions of left-aligned rows (:func:`left_align`) that the repetition
    penalty does not count: as many as the row's leading padding in ``padding_mask`` (B, T), the prompts as given
    (``transformers``' ``prompt_ignore_length``); the stable alignment puts exactly those pads first."""
    leading = (~padding_mask).int().argmax(dim=1)
    return torch.arange(columns, device=padding_mask.device)[None, :] < leading[:, None]


def counted(tokens: Tensor, uncounted: Optional[Tensor], vocab: int) -> Tensor:
    """``tokens`` (B, T) with the :func:`uncounted_positions` (their first T columns) replaced by ``vocab``."""
    return tokens if uncounted is None else tokens.masked_fill(uncounted[:, :tokens.shape[1]], vocab)


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


class Sequence:
    """The left-aligned prompts and the tokens chosen so far, in buffers allocated once: ``tokens`` (B, T0 + N),
    ``mask`` (B, T0 + N; True at the prompts' padding, None without any) and ``length``, the columns filled."""

    def __init__(self, prompts: Tensor, mask: Optional[Tensor], new_tokens: int) -> None:
        batch, self.prompt_length = prompts.shape
        self.tokens = prompts.new_zeros((batch, self.prompt_length + new_tokens))
        self.tokens[:, :self.prompt_length] = prompts
        self.mask: Optional[Tensor] = None
        if mask is not None:
            self.mask = torch.zeros_like(self.tokens, dtype=torch.bool)
            self.mask[:, :self.prompt_length] = mask
        self.length = self.prompt_length

    def append(self, chosen: Tensor) -> None:
        self.tokens[:, self.length] = chosen
        self.length += 1

    def window(self, start: int) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """Tokens, padding mask and position ids of the columns ``start .. length - 1`` (positions from 0)."""
        tokens = self.tokens[:, start:self.length]
        if self.mask is None:
            return tokens, None, None
        mask = self.mask[:, start:self.length]
        return tokens, mask, position_ids(mask)


class TokenDecoder(abc.ABC):
    """Next-token logits (B, V): after the prompt (:meth:`first`), then after each token chosen (:meth:`next`,
    called once the token is in the :class:`Sequence`)."""

    @abc.abstractmethod
    def first(self) -> Tensor: ...

    @abc.abstractmethod
    def next(self, chosen: Tensor) -> Tensor: ...


class Recompute(TokenDecoder):
    """No cache: every step reads the last ``max_positions`` tokens again, numbered from 0 (nanoGPT's window)."""

    def __init__(self, model: CausalModel, sequence: Sequence) -> None:
        self.model, self.sequence = model, sequence

    def first(self) -> Tensor:
        tokens, mask, positions = self.sequence.window(max(0, self.sequence.length - self.model.max_positions))
        return self.model(tokens, padding_mask=mask, position_ids=positions).logits[:, -1]

    def next(self, chosen: Tensor) -> Tensor:
        return self.first()


class Cached(TokenDecoder):
    """The prompt once, then one token per step through the layers' caches: static (allocated for every position
    the model will read, written in place) or growing; past ``max_positions`` the window slides without it."""

    def __init__(self, model: CausalModel, sequence: Sequence, static: bool, new_tokens: int) -> None:
        self.model, self.sequence = model, sequence
        # the last token chosen is never read, so the cache needs the prompt and new_tokens - 1 positions
        capacity = min(sequence.prompt_length + new_tokens - 1, model.max_positions) if static else None
        self.caches: Optional[list[KVCache]] = model.new_cache(capacity=capacity)
        self.next_position: Optional[Tensor] = None  # (B,) each row's next absolute position (padded prompts)
        self.recompute = Recompute(model, sequence)

    def first(self) -> Tensor:
        tokens, mask, positions = self.sequence.window(0)
        if mask is not None:
            self.next_position = (~mask).sum(1)
        return self.model(tokens, padding_mask=mask, position_ids=positions, cache=self.caches).logits[:, -1]

    def next(self, chosen: Tensor) -> Tensor:
        length = self.sequence.length
        if length > self.model.max_positions:
            self.caches = None  # the context slides from here on; the cache's memory goes back
            return self.recompute.next(chosen)
        mask = self.sequence.mask
        positions = None if self.next_position is None else self.next_position[:, None]
        logits = self.model(chosen[:, None], padding_mask=None if mask is None else mask[:, :length],
                            position_ids=positions, cache=self.caches).logits[:, -1]
        if self.next_position is not None:
            self.next_position.add_(1)
        return logits


class FixedShapeStep:
    """A compiled one-token step over a fixed-shape cache (see :class:`~interlayer.core.attention.KVCache`) for one
    batch size, capacity and padding: the caches, their shared ``position`` tensor and the padding mask live here,
    so a later call with the same shapes reuses the compiled code (and, on a GPU, the recorded CUDA graph). The
    model is an argument of every call, not an attribute: the step is kept in a weak dictionary keyed by the model,
    which a reference from the step would keep alive."""

    def __init__(self, model: CausalModel, batch: int, capacity: int, padded: bool, device: torch.device,
                 backend: Union[str, Callable[..., Any]]) -> None:
        self.capacity = capacity
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.caches = model.new_cache(capacity=capacity)
        for cache in self.caches:
            cache.position = self.position
        self.mask = torch.zeros((batch, capacity), dtype=torch.bool, device=device) if padded else None
        self.cuda_graphs = device.type == "cuda" and backend == "inductor"
        mode = "reduce-overhead" if self.cuda_graphs else None
        self.compiled: Callable[[CausalModel, Tensor, Tensor], Tensor] = torch.compile(
            self._step, backend=backend, mode=mode, fullgraph=True, dynamic=False)
        self._static_marked = False

    def _step(self, model: CausalModel, tokens: Tensor, positions: Tensor) -> Tensor:
        return model(tokens, padding_mask=self.mask, position_ids=positions, cache=self.caches).logits[:, -1]

    def prefill(self, model: CausalModel, tokens: Tensor, mask: Optional[Tensor], positions: Optional[Tensor]
                ) -> Tensor:
        """The prompt (eager; it allocates the buffers the first time), from position 0 of emptied caches."""
        for cache in self.caches:
            cache.reset()
        self.position.zero_()
        if self.mask is not None:
            self.mask.zero_()
            self.mask[:, :tokens.shape[1]] = mask
        logits = model(tokens, padding_mask=self.mask, position_ids=positions, cache=self.caches).logits
        self.position.fill_(tokens.shape[1])
        if not self._static_marked:  # the compiled step writes the buffers in place: fixed addresses
            for cache in self.caches:
                for buffer in cache.buffers.values():
                    torch._dynamo.mark_static_address(buffer)
            self._static_marked = True
        return logits[:, -1]

    def __call__(self, model: CausalModel, tokens: Tensor, positions: Tensor) -> Tensor:
        """Logits after ``tokens`` (B, 1) at ``positions`` (B, 1), written at the cache's ``position``, which then
        advances by one."""
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs have been read
        logits = self.compiled(model, tokens, positions)
        self.position.add_(1)
        return logits


# one compiled step per model (weakly held: it goes with the model), reused while the shapes stay the same
_STEPS: "weakref.WeakKeyDictionary[Any, tuple[tuple, FixedShapeStep]]" = weakref.WeakKeyDictionary()


def compiled_step(model: CausalModel, batch: int, capacity: int, padded: bool, device: torch.device,
                  backend: Union[str, Callable[..., Any]]) -> FixedShapeStep:
    """The model's compiled step for these shapes: the one kept from an earlier call, or a new one."""
    autocast = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    key = (batch, capacity, padded, device, backend, autocast, next(model.parameters()).dtype)
    kept = _STEPS.get(model)
    if kept is not None and kept[0] == key:
        return kept[1]
    _STEPS.pop(model, None)  # its buffers go before the new ones are allocated
    step = FixedShapeStep(model, batch, capacity, padded, device, backend)
    _STEPS[model] = (key, step)
    return step


def release_compiled_step(model: CausalModel) -> None:
    """Drop the compiled step kept for ``model`` (module docstring) and with it its caches' memory; the next
    ``compile=True`` call builds a new one. (It also goes when the model does.)"""
    _STEPS.pop(model, None)


class Compiled(TokenDecoder):
    """The prompt (eager), then the compiled fixed-shape step per token; past ``max_positions``, the window."""

    def __init__(self, model: CausalModel, sequence: Sequence, new_tokens: int,
                 backend: Union[str, Callable[..., Any]]) -> None:
        mixers = [i for i, layer in enumerate(model.encoder.layers)
                  if getattr(layer.self_attn, "logit_mixer", None) is not None]
        if mixers:
            raise ValueError(f"compile=True needs a fixed-shape KV cache, but layers {mixers} mix logits "
                             "(Predictive Attention), whose convolution state grows with the keys; generate with "
                             "compile=False (the static cache still applies)")
        self.model, self.sequence = model, sequence
        needed = sequence.prompt_length + new_tokens - 1
        capacity = min(-(-needed // CAPACITY_STEP) * CAPACITY_STEP, model.max_positions)
        tokens = sequence.tokens
        self.step = compiled_step(model, len(tokens), capacity, sequence.mask is not None, tokens.device, backend)
        self.next_position: Optional[Tensor] = None
        self.recompute = Recompute(model, sequence)

    def first(self) -> Tensor:
        tokens, mask, positions = self.sequence.window(0)
        self.next_position = (torch.full((len(tokens),), tokens.shape[1], device=tokens.device) if mask is None
                              else (~mask).sum(1))
        return self.step.prefill(self.model, tokens, mask, positions)

    def next(self, chosen: Tensor) -> Tensor:
        if self.sequence.length > self.step.capacity:
            return self.recompute.next(chosen)
        logits = self.step(self.model, chosen[:, None], self.next_position[:, None])
        self.next_position.add_(1)
        return logits


def decoder_for(model: CausalModel, sequence: Sequence, options: SamplingOptions) -> TokenDecoder:
    """The decoder the options ask for (module docstring); a prompt longer than the context is read without a
    cache, as every later window is."""
    use_cache = model.supports_cache if options.use_cache is None else options.use_cache
    if use_cache:
        model.new_cache()  # raises the reason when the model cannot be cached
    if not use_cache or sequence.prompt_length > model.max_positions:
        return Recompute(model, sequence)
    if options.compile:
        return Compiled(model, sequence, options.max_new_tokens, options.compile_backend)
    return Cached(model, sequence, options.static_cache, options.max_new_tokens)


@torch.no_grad()
def generate(model: CausalModel, prompts: Tensor, options: SamplingOptions = SamplingOptions(), *,
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
    batch, wanted, eos = len(prompts), options.max_new_tokens, options.eos_id
    out = prompts.new_zeros((batch, wanted), dtype=torch.long)
    lengths = torch.zeros(batch, dtype=torch.long, device=prompts.device)
    if wanted == 0:
        return Generation(tokens=out, lengths=lengths)
    padded = bool(padding_mask.any())
    tokens, mask = left_align(prompts, padding_mask) if padded else (prompts, None)
    sequence = Sequence(tokens, mask, wanted)
    penalised = options.repetition_penalty != 1.0
    uncounted = uncounted_positions(padding_mask, sequence.tokens.shape[1]) if padded and penalised else None
    decoder = decoder_for(model, sequence, options)
    finished = torch.zeros(batch, dtype=torch.bool, device=prompts.device)
    was_training = model.training
    model.eval()
    try:
        steps = 0
        logits = decoder.first()
        while steps < wanted:
            seen = counted(sequence.tokens[:, :sequence.length], uncounted, vocab) if penalised else None
            chosen = choose_tokens(logits, options, generator, seen=seen)
            if eos is not None:
                chosen = chosen.masked_fill(finished, eos)
                lengths += (~finished).long()
                finished |= chosen == eos
            out[:, steps] = chosen
            steps += 1
            if steps == wanted or (eos is not None and steps % options.stop_check_interval == 0
                                   and bool(finished.all())):
                break
            sequence.append(chosen)
            logits = decoder.next(chosen)
    finally:
        model.train(was_training)
    if eos is None:
        return Generation(tokens=out, lengths=lengths.fill_(wanted))
    # stopping at once would have left as many columns as the longest row produced (the last EOS included)
    return Generation(tokens=out[:, :int(lengths.max())], lengths=lengths)


@torch.no_grad()
def kv_cache_bytes_per_token(model: CausalModel, tokens: int = 4) -> int:
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
