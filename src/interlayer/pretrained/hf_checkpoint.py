"""A Hugging Face folder read into memory (:class:`HFCheckpoint`): its ``config.json`` checked against its
:mod:`family <interlayer.pretrained.families>`, its tensors under the core-facing names, and what the model will
read besides: the tokenizer (text; None with a note when the folder has none the core reproduces), the image
processor's normalisation (images), a sentence-transformers pooling and a task head whose layout the core shares.
:mod:`interlayer.pretrained.hf` builds the model from it; :mod:`~interlayer.pretrained.hf_load` copies its tensors.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from torch import Tensor

from ..data.tokenizers.byte_level_bpe import BPETokenizer
from ..data.tokenizers.gpt2 import load_gpt2_tokenizer
from ..data.tokenizers.language_model import LMTokenizer
from ..data.tokenizers.pretrained import PretrainedTokenizer, tokenizer_kind
from ..data.tokenizers.wordpiece import WordPieceTokenizer
from ..errors import PretrainedError, TokenizerError
from ..fileio import confined, read_json
from .families import SUPPORTED_MODEL_TYPES, VIT_PIXEL_MEAN, VIT_PIXEL_STD, VIT_RESCALE, HeadLayout, HFFamily, family_of
from .hf_files import read_weights

PROCESSOR_FILE = "preprocessor_config.json"
ST_MODULES = "modules.json"
AnyTokenizer = Union[PretrainedTokenizer, LMTokenizer]  # a classifier's, or a language model's (bytes or characters)


@dataclass
class HFCheckpoint:
    """A Hugging Face folder read into memory: its config, family, tensors (without the task prefix, TF-era
    LayerNorm names modernised), tokenizer and image normalisation."""

    directory: Path
    hf: dict[str, Any]
    family: HFFamily
    state: dict[str, Tensor]
    tokenizer: Optional[AnyTokenizer] = None
    notes: list[str] = field(default_factory=list)
    pixel_mean: Optional[list[float]] = None
    pixel_std: Optional[list[float]] = None

    @property
    def source(self) -> str:
        return str(self.directory)


def read_hf_config(directory: Union[str, Path]) -> tuple[dict[str, Any], HFFamily]:
    """``config.json`` of a supported checkpoint and its family, checked for everything the core cannot compute."""
    directory = Path(directory)
    if not directory.is_dir():
        raise PretrainedError(f"{directory} is not a directory; pass a Hugging Face checkpoint directory "
                              "(config.json, model.safetensors or pytorch_model.bin, tokenizer or processor files)")
    path = directory / "config.json"
    if not os.path.lexists(path):
        raise PretrainedError(f"{directory} has no config.json, so it is not a Hugging Face checkpoint")
    hf = read_json(path, PretrainedError, within=directory)  # names the file: bad UTF-8, bad JSON, not an object
    model_type = hf.get("model_type")
    family = family_of(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise PretrainedError(f"{path}: model_type={hf.get('model_type')!r} is not supported; supported types: "
                              f"{', '.join(SUPPORTED_MODEL_TYPES)} (ALBERT shares layers and factorises "
                              "embeddings)")
    problems = family.problems(hf)
    if problems:
        raise PretrainedError(f"{path}: this {hf['model_type']} variant cannot be represented: " + "; ".join(problems))
    return hf, family


def normalise_names(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """Drop the task checkpoints' encoder ``prefix`` and rename TF-era LayerNorm ``gamma``/``beta``."""
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        name = name[len(prefix):] if name.startswith(prefix) else name
        if ".LayerNorm." in name:
            name = name.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
        out[name] = tensor
    return out


def read_checkpoint(directory: Union[str, Path]) -> HFCheckpoint:
    """Config, family, tensors, tokenizer (text) or pixel normalisation (images) of a Hugging Face folder."""
    directory = Path(directory)
    hf, family = read_hf_config(directory)
    state = family.split(normalise_names(read_weights(directory), family.encoder_prefix(hf)))
    checkpoint = HFCheckpoint(directory, hf, family, state)
    if family.modality == "image":
        checkpoint.pixel_mean, checkpoint.pixel_std = _pixel_normalisation(directory, hf, checkpoint.notes)
    else:
        checkpoint.tokenizer = read_tokenizer(directory, hf, family, checkpoint.notes)
    return checkpoint


def read_tokenizer(directory: Path, hf: dict[str, Any], family: HFFamily, notes: list[str]
                   ) -> Optional[AnyTokenizer]:
    """The folder's tokenizer, truncating to what the position table numbers; None (with a note) without one."""
    if family.arch == "causal_lm" and tokenizer_kind(directory) == "bpe":
        tokenizer = load_gpt2_tokenizer(directory)
        if len(tokenizer) > hf["vocab_size"]:
            raise PretrainedError(f"{directory}: the tokenizer has {len(tokenizer)} ids but the embedding table "
                                  f"only {hf['vocab_size']} rows (vocab_size)")
        return tokenizer
    if tokenizer_kind(directory) is None or family.arch == "causal_lm":
        notes.append("no tokenizer files the core reproduces (vocab.txt, vocab.json + merges.txt, or a WordPiece or "
                     "BPE tokenizer.json; SentencePiece tokenizers such as XLM-R's are not supported): "
                     "model.tokenizer is None")
        return None
    tokenizer = load_tokenizer(directory, max_length=family.max_tokens(hf, config_pad_id(hf)))
    if tokenizer.vocab_size > hf["vocab_size"]:
        raise PretrainedError(f"{directory}: the tokenizer has {tokenizer.vocab_size} ids but the embedding table "
                              f"only {hf['vocab_size']} rows (vocab_size)")
    return tokenizer


def load_tokenizer(directory: Union[str, Path], *, max_length: Optional[int] = None) -> PretrainedTokenizer:
    """The tokenizer saved in ``directory`` (a checkpoint or a fine-tuning run's folder), WordPiece or BPE as
    :func:`~interlayer.data.tokenizers.pretrained.tokenizer_kind` decides."""
    kind = tokenizer_kind(directory)
    if kind is None:
        raise TokenizerError(f"{directory} has no tokenizer: expected vocab.txt (WordPiece), vocab.json + merges.txt "
                             "(byte-level BPE) or tokenizer.json")
    tokenizer_class = WordPieceTokenizer if kind == "wordpiece" else BPETokenizer
    return tokenizer_class.from_pretrained(directory, max_length=max_length)


def config_pad_id(hf: dict[str, Any]) -> int:
    default = 1 if hf.get("model_type") in ("roberta", "xlm-roberta") else 0
    pad = hf.get("pad_token_id", default)
    return pad if isinstance(pad, int) else default


def _pixel_normalisation(directory: Path, hf: dict[str, Any], notes: list[str]) -> tuple[list[float], list[float]]:
    """``pixel_mean``/``pixel_std`` in [0, 1] pixel units that reproduce the image processor's rescale and
    normalisation: the model sees ``(s x - mean) / std`` with ``s = 255 * rescale_factor`` (or 255 without
    rescaling), i.e. ``(x - mean / s) / (std / s)``."""
    channels = int(hf.get("num_channels", 3))
    settings = read_json(directory / PROCESSOR_FILE, TokenizerError, optional=True, within=directory)
    if not settings:
        notes.append(f"no {PROCESSOR_FILE}: ViTImageProcessor's defaults (rescale 1/255, mean {VIT_PIXEL_MEAN}, "
                     f"std {VIT_PIXEL_STD}) are the model's pixel normalisation")
    scale = 255.0 * float(settings.get("rescale_factor", VIT_RESCALE)) if settings.get("do_rescale", True) else 255.0
    if settings.get("do_normalize", True):
        mean, std = settings.get("image_mean", VIT_PIXEL_MEAN), settings.get("image_std", VIT_PIXEL_STD)
    else:
        mean, std = 0.0, 1.0
    mean = mean if isinstance(mean, list) else [mean] * channels
    std = std if isinstance(std, list) else [std] * channels
    return [float(m) / scale for m in mean], [float(s) / scale for s in std]


def sentence_transformers_pooling(directory: Path) -> Optional[str]:
    """``mean``/``cls`` from a sentence-transformers ``Pooling`` module config, or None when there is none."""
    modules_path = directory / ST_MODULES
    if not os.path.lexists(modules_path):
        return None
    for module in read_json(modules_path, PretrainedError, expect=list, within=directory):
        if isinstance(module, dict) and str(module.get("type", "")).endswith("Pooling"):
            config_path = directory / str(module.get("path", "")) / "config.json"
            modes = (read_json(confined(config_path, directory, PretrainedError, named_by=modules_path),
                               PretrainedError) if os.path.lexists(config_path) else {})
            chosen = [mode for mode, on in modes.items() if mode.startswith("pooling_mode_") and on]
            if chosen == ["pooling_mode_mean_tokens"]:
                return "mean"
            if chosen == ["pooling_mode_cls_token"]:
                return "cls"
            raise PretrainedError(f"{config_path}: pooling {chosen} has no core equivalent; pass pooling='cls' or "
                                  "pooling='mean'")
    return None



def checkpoint_head(checkpoint: HFCheckpoint, num_classes: Optional[int]) -> tuple[Optional[HeadLayout], int]:
    """The checkpoint's classification head whose layout the core shares, and its class count (0 without)."""
    architectures = checkpoint.hf.get("architectures") or []
    for layout in checkpoint.family.heads:
        weight = next(name for name in layout.head if name.endswith("weight"))
        if any(a in layout.architectures for a in architectures) and weight in checkpoint.state:
            classes = checkpoint.state[weight].shape[0]
            if classes < 2 and num_classes is None:
                raise PretrainedError(f"the checkpoint's classifier has {classes} output (regression); interlayer "
                                      "classifiers need num_classes >= 2: pass num_classes=N to start a new head")
            return layout, classes
    return None, 0


def checkpoint_tokenizer(directory: Union[str, Path]) -> PretrainedTokenizer:
    """The checkpoint's tokenizer as :func:`import_bert` returns it (truncating to the position table at most)."""
    checkpoint = read_checkpoint(directory)
    if checkpoint.tokenizer is None:
        raise PretrainedError(f"{directory}: " + " ".join(checkpoint.notes))
    return checkpoint.tokenizer
