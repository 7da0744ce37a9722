"""``transformers``' ``generate`` call on the causal language model: :func:`generate_like_hf`, its options resolved
as ``transformers`` resolves them.

Priority, as ``GenerationMixin._prepare_generation_config``: the call's keyword arguments, then the
``generation_config`` passed (a ``transformers.GenerationConfig`` or a dict), then the model's own (its config's
``bos``/``eos``/``pad_token_id`` and whatever ``model.generation_config`` holds once set), then ``transformers``'
global defaults (greedy, ``top_k=50``, ``top_p=1``, ``temperature=1``, one beam, ``length_penalty=1``,
``early_stopping=False``, one sequence per prompt). A value of None is "not set" at every level.

What is supported (:data:`SUPPORTED`): the length (``max_new_tokens``, or ``max_length`` counting the prompt),
greedy and sampled decoding (``do_sample``, ``temperature``, ``top_k``, ``top_p``), ``repetition_penalty``
(CTRL's, Keskar et al. 2019, as ``RepetitionPenaltyLogitsProcessor``), beam search (``num_beams``,
``length_penalty``, ``early_stopping``: :mod:`interlayer.core.beam_search`), ``num_return_sequences``, the special
tokens, ``use_cache`` (True: the KV cache whenever the model has one; a Multi-Pass model reads without) and
``return_dict_in_generate``. Any other option set to something other than its default
(``no_repeat_ngram_size``, ``output_scores``, beam sampling, ...) raises :class:`UnsupportedGenerationOption`
naming it: silently ignoring it would return other tokens than ``transformers`` would. (The ``transformers``
classes interlayer registers fall back to ``transformers``' own ``generate`` for those:
:mod:`interlayer.pretrained.transformers_classes.modeling`.)

One deliberate difference: with neither ``max_new_tokens`` nor ``max_length`` set anywhere, 20 tokens are added
(``transformers``' default ``max_length=20`` counts the prompt, so a prompt of 20 tokens or more would get one).

An ``eos_token_id`` outside the vocabulary (``GPT2Config(vocab_size=101)`` keeps GPT-2's 50256, as many small test
configs do) is what ``transformers`` makes of it: a token the model never produces, so no row stops early; a
warning says so once per id and vocabulary size (:func:`reachable_eos`). The typed
:class:`~interlayer.core.generation.SamplingOptions` still refuse it: there the id is the caller's own. A prompt id
outside the vocabulary where the model reads is refused naming its position (a character tokenizer's ``[UNK]``
lies past the table: :mod:`interlayer.data.tokenizers.language_model`); at padded positions any id stands (never read).
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, fields
from typing import Any, Optional, Union

import torch
from torch import Tensor

from ..errors import UnsupportedGenerationOption
from .beam_search import beam_search
from .generation import CausalModel, SamplingOptions, generate

DEFAULTS: dict[str, Any] = dict(do_sample=False, temperature=1.0, top_k=50, top_p=1.0, repetition_penalty=1.0,
                                num_beams=1, length_penalty=1.0, early_stopping=False, num_return_sequences=1,
                                return_dict_in_generate=False)
SUPPORTED = (*DEFAULTS, "max_new_tokens", "max_length", "eos_token_id", "pad_token_id", "bos_token_id", "use_cache")
# GenerationConfig entries that say nothing about decoding (bookkeeping, or what interlayer models always do)
IGNORED = ("transformers_version", "_from_model_config", "_commit_hash", "_original_object_hash",
           "output_attentions", "output_hidden_states", "decoder_start_token_id", "is_assistant")
_WARNED: set[tuple[int, int]] = set()  # (eos id, vocabulary size) pairs already warned about


@dataclass(frozen=True)
class HFGenerationSettings:
    """One ``generate`` call's options, resolved (module docstring)."""

    max_new_tokens: int
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    num_beams: int
    length_penalty: float
    early_stopping: Union[bool, str]
    num_return_sequences: int
    eos_token_id: Optional[int]
    pad_token_id: Optional[int]
    use_cache: Optional[bool]  # None or True: the KV cache whenever the model supports one; False: none
    return_dict_in_generate: bool


@dataclass
class GenerateOutput:
    """``return_dict_in_generate=True``: ``transformers``' ``GenerateDecoderOnlyOutput`` /
    ``GenerateBeamDecoderOnlyOutput`` fields that interlayer fills: the sequences (prompts and continuations) and, for
    beam search, each returned sequence's score (its summed log-probabilities over ``length ** length_penalty``)."""

    sequences: Tensor
    sequences_scores: Optional[Tensor] = None

    def __getitem__(self, key: Union[str, int]) -> Any:
        if isinstance(key, str):
            return getattr(self, key)
        return tuple(v for v in (self.sequences, self.sequences_scores) if v is not None)[key]

    def keys(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]


def _given(source: Any) -> dict[str, Any]:
    """The options a generation config (or dict) sets: ``to_diff_dict()`` of a ``GenerationConfig``."""
    if source is None:
        return {}
    if isinstance(source, dict):
        values = dict(source)
    elif callable(getattr(source, "to_diff_dict", None)):
        values = source.to_diff_dict()
    else:
        raise TypeError(f"generation_config must be a transformers.GenerationConfig or a dict, got "
                        f"{type(source).__name__}")
    return {key: value for key, value in values.items() if value is not None and key not in IGNORED}


def _one_id(name: str, value: Any) -> Optional[int]:
    """A token id given as an int or a one-element list (``transformers`` allows several EOS ids)."""
    if isinstance(value, (list, tuple)):
        if len(value) > 1:
            raise UnsupportedGenerationOption(f"{name}={list(value)}: several ids; interlayer's generate takes one")
        value = value[0] if value else None
    return None if value is None else int(value)


def resolve_settings(model_defaults: dict[str, Any], generation_config: Any, kwargs: dict[str, Any],
                     prompt_length: int) -> HFGenerationSettings:
    """The settings of one call: ``kwargs`` over ``generation_config`` over ``model_defaults`` over the global
    defaults (module docstring); raises :class:`UnsupportedGenerationOption` for an option set that is not
    supported, ``ValueError`` for a bad value."""
    options = dict(DEFAULTS)
    for layer in (_given(model_defaults), _given(generation_config), _given(kwargs)):
        options.update(layer)
    unsupported = {key: value for key, value in options.items() if key not in SUPPORTED}
    if unsupported:
        raise UnsupportedGenerationOption(
            f"generate does not implement {', '.join(f'{k}={v!r}' for k, v in sorted(unsupported.items()))}; it "
            f"takes {', '.join(SUPPORTED)} (the transformers classes of interlayer models run transformers' own "
            "generate for the others)")
    if options["do_sample"] and options["num_beams"] > 1:
        raise UnsupportedGenerationOption("do_sample=True with num_beams > 1 (beam sampling) is not implemented; "
                                          "use num_beams=1 to sample or do_sample=False for beam search")
    if "max_new_tokens" in options:
        new = int(options["max_new_tokens"])
    elif "max_length" in options:
        new = int(options["max_length"]) - prompt_length
        if new < 1:
            raise ValueError(f"max_length={options['max_length']} counts the prompt, which already has "
                             f"{prompt_length} positions; set max_new_tokens instead")
    else:
        new = 20  # module docstring: 20 new tokens, not transformers' max_length=20 with the prompt
    if options["do_sample"] and not options["temperature"] > 0:
        raise ValueError(f"temperature={options['temperature']} must be > 0 when do_sample=True (do_sample=False is "
                         "greedy)")
    for key in ("num_beams", "num_return_sequences"):
        if not isinstance(options[key], int) or options[key] < 1:
            raise ValueError(f"{key}={options[key]!r} must be a positive integer")
    if options["num_beams"] == 1 and options["num_return_sequences"] > 1 and not options["do_sample"]:
        raise ValueError(f"num_return_sequences={options['num_return_sequences']} with greedy decoding would return "
                         "the same sequence again; sample (do_sample=True) or search num_beams >= it")
    if options["num_return_sequences"] > options["num_beams"] > 1:
        raise ValueError(f"num_return_sequences={options['num_return_sequences']} exceeds num_beams="
                         f"{options['num_beams']}: beam search keeps num_beams hypotheses")
    if options["early_stopping"] not in (True, False, "never"):
        raise ValueError(f"early_stopping={options['early_stopping']!r} must be True, False or 'never'")
    eos = _one_id("eos_token_id", options.get("eos_token_id"))
    pad = _one_id("pad_token_id", options.get("pad_token_id"))
    return HFGenerationSettings(
        max_new_tokens=new, do_sample=bool(options["do_sample"]), temperature=float(options["temperature"]),
        top_k=int(options["top_k"]), top_p=float(options["top_p"]),
        repetition_penalty=float(options["repetition_penalty"]), num_beams=options["num_beams"],
        length_penalty=float(options["length_penalty"]), early_stopping=options["early_stopping"],
        num_return_sequences=options["num_return_sequences"], eos_token_id=eos,
        pad_token_id=eos if pad is None else pad, use_cache=None if options.get("use_cache", True) else False,
        return_dict_in_generate=bool(options["return_dict_in_generate"]))


def reachable_eos(eos_token_id: Optional[int], vocab_size: int) -> Optional[int]:
    """``eos_token_id``, or None when no logit can produce it (outside ``0 .. vocab_size - 1``), with a warning
    the first time (module docstring)."""
    if eos_token_id is None or 0 <= eos_token_id < vocab_size:
        return eos_token_id
    if (eos_token_id, vocab_size) not in _WARNED:
        _WARNED.add((eos_token_id, vocab_size))
        warnings.warn(f"eos_token_id={eos_token_id} is not a token of this model (ids 0..{vocab_size - 1}), so it is "
                      "never generated and every row runs to its length, as in transformers; set the model's "
                      "generation_config.eos_token_id (or pass eos_token_id=) to a token of the vocabulary",
                      stacklevel=3)
    return None


def generate_like_hf(model: CausalModel, input_ids: Tensor, *, padding_mask: Optional[Tensor] = None,
                     generator: Optional[torch.Generator] = None, generation_config: Any = None,
                     **options: Any) -> Union[Tensor, GenerateOutput]:
    """``transformers``' ``generate``: the prompts followed by their continuations.

    ``options`` and ``generation_config`` are ``transformers``' (``max_new_tokens``, ``max_length``, ``do_sample``,
    ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``num_beams``, ``length_penalty``,
    ``early_stopping``, ``num_return_sequences``, ``eos_token_id``, ``pad_token_id``, ``use_cache``,
    ``return_dict_in_generate``), resolved over the model's own settings and ``transformers``' defaults as
    ``transformers`` resolves them (module docstring; another option raises :class:`UnsupportedGenerationOption`).
    ``num_beams > 1`` is beam search (:mod:`interlayer.core.beam_search`), otherwise
    :func:`~interlayer.core.generation.generate`. A row that produced ``eos_token_id`` is filled with ``pad_token_id``
    (``eos_token_id`` when none is given), and the batch stops once every row has. The prompts come back as given,
    padding and all (left padding is what transformers expects, and any padding works here: see
    :mod:`interlayer.core.generation`); ``return_dict_in_generate`` wraps them in a :class:`GenerateOutput` (with beam
    search, the sequences' scores too).
    """
    settings = resolve_settings(model.generation_defaults(), generation_config, options, input_ids.shape[-1])
    vocab = model.lm_head.out_features
    settings = dataclasses.replace(settings, eos_token_id=reachable_eos(settings.eos_token_id, vocab))
    read = input_ids if padding_mask is None else input_ids.masked_fill(padding_mask, 0)
    outside = (read < 0) | (read >= vocab)
    if bool(outside.any()):
        row, column = (int(i) for i in outside.nonzero()[0])
        raise ValueError(f"input_ids[{row}, {column}] = {int(input_ids[row, column])} is not a token of this model "
                         f"(ids 0..{vocab - 1}): a tokenizer's unknown token ([UNK] stands for a character the "
                         "model's vocabulary lacks; remove it from the text) or another model's tokenizer")
    scores = None
    if settings.num_beams > 1:
        result = beam_search(model, input_ids, num_beams=settings.num_beams, max_new_tokens=settings.max_new_tokens,
                             padding_mask=padding_mask, eos_token_id=settings.eos_token_id,
                             pad_token_id=settings.pad_token_id, length_penalty=settings.length_penalty,
                             early_stopping=settings.early_stopping,
                             num_return_sequences=settings.num_return_sequences,
                             repetition_penalty=settings.repetition_penalty, use_cache=settings.use_cache)
        sequences, scores = result.sequences, result.scores
    else:
        copies = settings.num_return_sequences
        prompts = input_ids.repeat_interleave(copies, dim=0) if copies > 1 else input_ids
        mask = padding_mask.repeat_interleave(copies, dim=0) if copies > 1 and padding_mask is not None \
            else padding_mask
        sampling = SamplingOptions(max_new_tokens=settings.max_new_tokens,
                                   temperature=settings.temperature if settings.do_sample else 0.0,
                                   top_k=settings.top_k if settings.do_sample else 0,
                                   top_p=settings.top_p if settings.do_sample else 1.0, eos_id=settings.eos_token_id,
                                   use_cache=settings.use_cache, repetition_penalty=settings.repetition_penalty)
        if sampling.use_cache is None and not model.supports_cache:
            sampling = dataclasses.replace(sampling, use_cache=False)
        out = generate(model, prompts, sampling, padding_mask=mask, generator=generator)
        new = out.tokens
        if settings.eos_token_id is not None and settings.pad_token_id is not None:
            produced = torch.arange(new.shape[1], device=new.device)[None, :] < out.lengths[:, None]
            new = new.masked_fill(~produced, settings.pad_token_id)
        sequences = torch.cat([prompts, new.to(prompts.dtype)], dim=1)
    if settings.return_dict_in_generate:
        return GenerateOutput(sequences=sequences, sequences_scores=scores)
    return sequences
