"""Interlayer models out: :func:`to_hf` writes a folder ``transformers`` loads with the same outputs.

Any interlayer model whose computation one :mod:`family <interlayer.pretrained.families>` expresses exports:
imported models, and models trained from scratch whose config happens to be a BERT, RoBERTa, DistilBERT, ViT or
GPT-2 (the check is exact: the family's ``config.json`` must translate back to the model's own core fields). What
is written, per family and head:

* BERT with ``pooling="cls"`` and the pooler: ``BertForSequenceClassification``; RoBERTa likewise
  ``RobertaForSequenceClassification`` (the pooler is its ``classifier.dense``); ViT without pooler:
  ``ViTForImageClassification``. ``AutoModelFor{Sequence,Image}Classification`` then gives the same logits.
* Otherwise the bare encoder (``BertModel``, ``RobertaModel``, ``DistilBertModel``, ``ViTModel`` with its pooler)
  and a warning that the classification head has no ``transformers`` form and is left out; mean pooling adds a
  sentence-transformers ``Pooling`` config.
* A language model (``arch="causal_lm"``): ``GPT2LMHeadModel`` (``lm_head.weight`` only when the output is not
  tied to the token table; ``transformers`` ties it again on loading), with ``bos_token_id``/``eos_token_id`` the
  tokenizer's ``<|endoftext|>`` when it has one (else null). A model trained from scratch maps when it has GPT-2's
  architecture: learned positions, pre-LN, biases, no embedding scale or LayerNorm, a GELU (tanh or exact) or ReLU.
* The tokenizer files (the import's ``model.tokenizer`` or ``tokenizer=``) for text; ``preprocessor_config.json``
  (``ViTImageProcessor``: resize to the model's size, rescale 1/255, the model's ``pixel_mean``/``pixel_std``)
  for images. An ``input_size`` adapter (grey images resized for a pretrained ViT) is not exported: the processor
  resizes, and grey images must be given as 3 channels.

Refused, with the reason: any method section but Crossformer (Predictive Attention, Multi-Pass, LW, the conv
branch compute something no ``transformers`` class computes; Crossformer's soft guidance is only a training loss
and its hard-tied matrices are written as separate copies, which computes the same), core settings outside every
family (relative or rotary positions, ``qk_dim``, pre-LN text encoders, post-LN or bias-free language models,
...), the Conv-Transformer, encoder-decoders, the CNN and GAT. Such models are saved in interlayer's own format:
``model.save_pretrained(directory)``, or by :func:`export` (``interlayer export``), which writes that format with
the same tokenizer, run files and model card, and says why.

Besides the weights (:mod:`~interlayer.pretrained.run_assets`): the tokenizer of the import or of the run the
model was loaded from, the labels' names (``id2label``), a model card (``README.md``) and, for a language model,
``generation_config.json``.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, Union

from safetensors.torch import save_file
from torch import nn

from ..checkpoint import model_kind, save_for_transformers, transformers_config
from ..config import ModelConfig
from ..core.lm import CausalLM
from ..core.models import EncoderClassifier
from ..data.tokenizers.gpt2 import end_of_text_id, save_gpt2_tokenizer
from ..data.tokenizers.language_model import CHAR_PAD, ByteBPETokenizer, CharTokenizer
from ..data.tokenizers.language_model import save_tokenizer as save_lm_tokenizer
from ..errors import PretrainedError
from ..models.vision import ImageClassifier
from .families import FAMILIES, HeadLayout, HFFamily, ViTFamily, family_named
from .hf_checkpoint import PROCESSOR_FILE, ST_MODULES, AnyTokenizer
from .hf_core_config import encoder_config
from .run_assets import RunAssets, auto_class_of, copy_run_files, model_card, read_run_assets
from .transformers_classes.remote_code import write_remote_code

OWN_FORMAT = ("export it with interlayer.export (`interlayer export`), which writes it for interlayer's "
              "transformers classes (AutoModel... after `import interlayer`), or save it with "
              "model.save_pretrained(directory)")


def to_hf(model: nn.Module, directory: Union[str, Path], *, tokenizer: Union[AnyTokenizer, None, bool] = None,
          family: Optional[str] = None, labels: Optional[Sequence[str]] = None) -> Path:
    """Write ``config.json``, ``model.safetensors``, tokenizer/processor files, ``README.md`` (a model card) and,
    for a language model, ``generation_config.json``: a folder ``transformers`` loads.

    ``family`` (``"bert"``, ``"roberta"``, ``"distilbert"``, ``"vit"``, ``"gpt2"``) defaults to the one family that
    expresses the model. ``tokenizer`` defaults to the model's own: an import's ``model.tokenizer``, or the
    tokenizer of the run folder it was loaded from (:mod:`~interlayer.pretrained.run_assets`); ``False`` exports
    without one. ``labels`` (the classes' names, ``id2label``) default to the run's. Raises
    :class:`PretrainedError` naming what no family (or the chosen one) can express, and a run's tokenizer that
    ``transformers`` cannot load.
    """
    chosen = _family_for(model, family)
    assets = read_run_assets(model)
    plan = _plan(model, chosen, assets, tokenizer, labels)
    if plan.problems:
        raise PretrainedError(f"cannot export as a Hugging Face {chosen.title}: " + "; ".join(plan.problems)
                              + f"; {OWN_FORMAT}")
    return _write_hf(model, Path(directory), chosen, assets, plan)


@dataclass
class ExportReport:
    """What :func:`export` wrote: ``format`` ``"transformers"`` (a ``transformers`` family's own classes) or
    ``"interlayer"`` (interlayer's classes for ``transformers``: then ``reason`` says why no family computes the
    model; ``with_code``: the folder carries that code)."""

    directory: Path
    format: Literal["transformers", "interlayer"]
    architecture: str
    reason: Optional[str] = None
    with_code: bool = False


def export(model: nn.Module, directory: Union[str, Path], *, tokenizer: Union[AnyTokenizer, None, bool] = None,
           family: Optional[str] = None, labels: Optional[Sequence[str]] = None,
           with_code: bool = False) -> ExportReport:
    """What ``interlayer export`` runs: :func:`to_hf` when a ``transformers`` family computes the model (its own
    classes: ``BertForSequenceClassification``, ``GPT2LMHeadModel``, ...); otherwise (a method no family computes:
    PA, value residuals, hyper-connections, ...; a trained head a family has no place for) a folder for
    interlayer's classes for ``transformers`` (:mod:`~interlayer.pretrained.transformers_classes.modeling`):
    ``config.json`` with ``model_type: "interlayer"``, ``model.safetensors``, the tokenizer as ``AutoTokenizer``
    loads it, the run's files and a model card, which ``AutoModelFor...from_pretrained`` loads after ``import
    interlayer`` and ``interlayer.load_pretrained`` loads too. ``with_code`` also copies interlayer's model code into
    that folder (:mod:`~interlayer.pretrained.transformers_classes.remote_code`) so that it loads with
    ``trust_remote_code=True`` where interlayer is not installed; a folder of a ``transformers`` family needs no
    code."""
    directory = Path(directory)
    chosen: Optional[HFFamily] = None
    problems: list[str]
    try:
        chosen = _family_for(model, family)
    except PretrainedError as err:
        if family is not None:
            raise
        problems = [str(err).removesuffix(f"; {OWN_FORMAT}")]
    assets = read_run_assets(model)
    if chosen is not None:
        plan = _plan(model, chosen, assets, tokenizer, labels)
        problems = plan.problems + _lost_head(model, chosen)
        if not problems:
            _write_hf(model, directory, chosen, assets, plan)
            return ExportReport(directory, "transformers", plan.config["architectures"][0])
    return _write_interlayer(model, directory, assets, tokenizer, labels, "; ".join(problems), with_code)


def _write_interlayer(model: nn.Module, directory: Path, assets: RunAssets,
                      tokenizer: Union[AnyTokenizer, None, bool], labels: Optional[Sequence[str]], reason: str,
                      with_code: bool) -> ExportReport:
    """A folder for interlayer's ``transformers`` classes (see :func:`export`)."""
    directory.mkdir(parents=True, exist_ok=True)
    copy_run_files(assets, directory, tokenizer_files=tokenizer is not False)
    chosen = assets.tokenizer if tokenizer in (None, True) else (tokenizer or None)
    config = transformers_config(model)
    core = encoder_config(model.config)
    names = list(labels) if labels is not None else assets.labels
    if names is not None and len(names) == core.num_classes:
        config["id2label"] = {str(i): name for i, name in enumerate(names)}
        config["label2id"] = {name: i for i, name in enumerate(names)}
    language_model = core.arch == "causal_lm"
    if language_model and config.get("eos_token_id") is None and isinstance(chosen, ByteBPETokenizer):
        eos = end_of_text_id(chosen)
        if eos is not None:
            config.update(bos_token_id=eos, eos_token_id=eos)
    if with_code:
        config["auto_map"] = write_remote_code(directory, config["interlayer"]["model_type"], model_kind(model))
    save_for_transformers(model, directory, config)
    if language_model:  # the special ids the vocabulary has: pad = EOS (GPT-2's habit), or a character tokenizer's
        # [PAD], past the model's table (so not in config.json, whose special ids transformers checks against it)
        generation = {key: config[key] for key in ("bos_token_id", "eos_token_id") if config.get(key) is not None}
        if "eos_token_id" in generation:
            generation["pad_token_id"] = generation["eos_token_id"]
        elif isinstance(chosen, CharTokenizer):
            generation["pad_token_id"] = chosen.special_id(CHAR_PAD)
        (directory / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    if chosen is not None:
        _save_tokenizer(chosen, directory, core)
    architecture = config["architectures"][0]
    auto = auto_class_of(architecture)
    note = (f"This folder is written for interlayer's transformers class {architecture} ({reason}): "
            f"`{auto}.from_pretrained(folder)` loads it after `import interlayer`"
            + (", or without interlayer installed with `trust_remote_code=True` (this folder carries interlayer's "
               "model code)" if with_code else "") + ".")
    (directory / "README.md").write_text(model_card(model, assets, library="interlayer", architecture=architecture,
                                                    note=note, tokenizer=chosen, with_code=with_code))
    return ExportReport(directory, "interlayer", architecture, reason, with_code)


@dataclass
class _Plan:
    problems: list[str]
    tokenizer: Optional[AnyTokenizer] = None
    labels: Optional[list[str]] = None
    config: dict[str, Any] = field(default_factory=dict)


def _plan(model: nn.Module, family: HFFamily, assets: RunAssets, tokenizer: Union[AnyTokenizer, None, bool],
          labels: Optional[Sequence[str]]) -> _Plan:
    """What a transformers export would write, and what stops it."""
    cfg = encoder_config(model.config)
    problems = _problems(family, model, cfg)
    if tokenizer is None or tokenizer is True:
        chosen_tokenizer = assets.tokenizer
        if chosen_tokenizer is None and assets.unexportable_tokenizer:
            problems.append(f"{assets.unexportable_tokenizer} has no transformers tokenizer (pass tokenizer=False, "
                            "or --no-tokenizer, to export the model without it)")
        elif chosen_tokenizer is None and tokenizer is True:
            problems.append("a tokenizer was asked for, but the model has none (it was not loaded from a run or an "
                            "import that had one): pass it as tokenizer=")
    else:
        chosen_tokenizer = tokenizer or None
    problems += _tokenizer_problems(chosen_tokenizer, family, cfg)
    names = list(labels) if labels is not None else assets.labels
    layout = _head_layout(family, cfg)
    if names is not None and layout is not None and len(names) != cfg.num_classes:
        problems.append(f"{len(names)} label names ({', '.join(names)}) for {cfg.num_classes} classes")
    config = _hf_config(family, model, cfg, layout, names) if not problems else {}
    return _Plan(problems, chosen_tokenizer, names, config)


def _lost_head(model: nn.Module, family: HFFamily) -> list[str]:
    """A classifier whose trained head ``to_hf`` would leave out (it only warns): :func:`export` keeps it by
    writing interlayer's own format instead."""
    cfg = encoder_config(model.config)
    if family.arch == "causal_lm" or _head_layout(family, cfg) is not None:
        return []
    return [f"{cfg.pooling!r} pooling {'with' if cfg.classifier_hidden else 'without'} a pooler has no transformers "
            f"classifier for {family.title} (to_hf would export the encoder and leave the trained head out)"]


def _write_hf(model: nn.Module, directory: Path, chosen: HFFamily, assets: RunAssets, plan: _Plan) -> Path:
    cfg = encoder_config(model.config)
    tokenizer = plan.tokenizer
    directory.mkdir(parents=True, exist_ok=True)
    layout = _head_layout(chosen, cfg)
    names = chosen.layer_map(cfg.enc_layers)
    if cfg.classifier_hidden:
        names.update(layout.pooler if layout is not None and layout.pooler else chosen.pooler_map())
    if layout is not None:
        names.update(layout.head)
    language_model = chosen.arch == "causal_lm"
    heads = set(layout.head) | set(layout.pooler) if layout is not None else set()
    if language_model and not cfg.tie_output:
        heads = set(chosen.output_map(cfg))
        names.update(chosen.output_map(cfg))
    params = dict(model.named_parameters(remove_duplicate=False))
    prefix = chosen.prefix if layout is not None or language_model else ""
    tensors = chosen.join({hf: chosen.to_hf(hf, params[core].detach().clone()) for hf, core in names.items()})
    tensors = {(hf if hf in heads else prefix + hf): tensor.contiguous() for hf, tensor in tensors.items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = plan.config
    if language_model:
        eos = end_of_text_id(tokenizer)
        config.update(bos_token_id=eos, eos_token_id=eos)
        # transformers' generate reads these; pad_token_id: GPT-2 has none, so its EOS, as transformers suggests
        (directory / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}, indent=2) + "\n")
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        _save_tokenizer(tokenizer, directory, cfg, gpt2=language_model)
    if isinstance(model, ImageClassifier):
        _write_processor(directory, model)
    if cfg.pooling == "mean":
        _write_sentence_transformers(directory, cfg.d_model)
    (directory / "README.md").write_text(model_card(model, assets, library="transformers",
                                                    architecture=config["architectures"][0]))
    if layout is None and not language_model:
        warnings.warn(f"{cfg.pooling!r} pooling {'with' if cfg.classifier_hidden else 'without'} a pooler has no "
                      f"transformers classifier for {chosen.title}: the encoder is exported as "
                      f"{config['architectures'][0]} and the classification head is left out", stacklevel=3)
    return directory


def _save_tokenizer(tokenizer: AnyTokenizer, directory: Path, cfg: ModelConfig, gpt2: bool = False) -> None:
    """The tokenizer's files as ``AutoTokenizer`` loads them: GPT-2's own for a byte-level BPE in a GPT-2 export
    (``gpt2``), a ``tokenizers`` pipeline (``tokenizer.json``) for the language-model tokenizers otherwise, a
    checkpoint tokenizer's own."""
    if isinstance(tokenizer, ByteBPETokenizer) and gpt2:
        save_gpt2_tokenizer(tokenizer, directory, max_length=cfg.max_positions)
    elif isinstance(tokenizer, (ByteBPETokenizer, CharTokenizer)):  # no [PAD]/[UNK] past GPT-2's table
        save_lm_tokenizer(tokenizer, directory, max_length=cfg.max_positions, char_specials=not gpt2)
    else:
        tokenizer.save_pretrained(directory)


def _family_for(model: nn.Module, name: Optional[str]) -> HFFamily:
    """The named family, or the one family that expresses the model (see :func:`to_hf`)."""
    if name is not None:
        try:
            return family_named(name)
        except KeyError:
            raise PretrainedError(f"family={name!r} is not known; choose one of "
                                  f"{', '.join(f.name for f in FAMILIES)}") from None
    if isinstance(model, ImageClassifier):
        if model.config.backbone != "vit":
            raise PretrainedError(f"backbone={model.config.backbone!r} (the PA Conv-Transformer/CNN) has no Hugging "
                                  f"Face class; {OWN_FORMAT}")
        return next(f for f in FAMILIES if isinstance(f, ViTFamily))
    language_model = isinstance(model, CausalLM)
    if not (language_model or isinstance(model, EncoderClassifier)) or getattr(model, "encoder", None) is None:
        raise PretrainedError(f"a {type(model).__name__} has no Hugging Face class here (text and image encoder "
                              f"classifiers and language models export); {OWN_FORMAT}")
    cfg: ModelConfig = model.config
    arch = "causal_lm" if language_model else "encoder_classifier"
    candidates = [f for f in FAMILIES if f.modality == "text" and f.arch == arch]
    mismatches = {f.title: _field_problems(f, cfg) for f in candidates}
    fitting = [f for f in candidates if not mismatches[f.title]]
    if fitting:
        return fitting[0]
    core = "; ".join(f"not {title}: {problems[0]}" + (f" and {len(problems) - 1} more" if len(problems) > 1 else "")
                     for title, problems in mismatches.items())
    methods = _computing_methods(cfg)
    if methods:  # what the user chose and no family has comes first; the core's differences after it
        raise PretrainedError(f"no Hugging Face family computes {methods} (nor this core: {core}); {OWN_FORMAT}")
    raise PretrainedError(f"no Hugging Face family computes this model ({core}); {OWN_FORMAT}")


def _computing_methods(cfg: ModelConfig) -> str:
    """The method sections that change the computation (a ties-only one, Crossformer or layer sharing, computes the
    plain model), named for a message: ``"the predictive section"``, ``"the predictive and mhc sections"``, or
    ``""``."""
    names = [m.name for m, _ in cfg.sections() if not getattr(m, "ties_only", False)]
    if not names:
        return ""
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"the {listed} section{'s' if len(names) > 1 else ''}"


def _field_problems(family: HFFamily, cfg: ModelConfig) -> list[str]:
    """Core fields the family's ``config.json`` cannot carry: it must translate back to exactly ``cfg``'s."""
    hf = family.hf_config(cfg)
    expected = family.core_fields(hf)
    return family.problems(hf) + [f"{key}={getattr(cfg, key)!r} ({family.title} has {value!r})"
                                  for key, value in expected.items()
                                  if key not in family.unused_fields and getattr(cfg, key) != value]


def _problems(family: HFFamily, model: nn.Module, cfg: ModelConfig) -> list[str]:
    problems = _field_problems(family, cfg)
    if family.modality == "image" and not isinstance(model, ImageClassifier):
        problems.append("a text model (ViT reads images)")
    if family.modality == "text" and isinstance(model, ImageClassifier):
        problems.append("an image model (this family reads text)")
    elif family.arch == "causal_lm" and not isinstance(model, CausalLM):
        problems.append(f"a {type(model).__name__} ({family.title} is a language model)")
    elif family.modality == "text" and family.arch != "causal_lm" and not isinstance(model, EncoderClassifier):
        problems.append(f"a {type(model).__name__} ({family.title} is an encoder classifier)")
    if isinstance(model, ImageClassifier) and model.config.backbone != "vit":
        problems.append(f"backbone={model.config.backbone!r}")
    # A method that only ties weights (Crossformer, layer sharing) computes the plain model: the export writes each
    # tied tensor under every name it has, which is how a family without ties stores them.
    methods = _computing_methods(cfg)
    if methods:
        problems.insert(0, f"{methods} ({family.title} has no such computation)")
    if cfg.classifier_hidden and not family.has_pooler:
        problems.append(f"classifier_hidden={cfg.classifier_hidden} ({family.title} has no pooler)")
    elif cfg.classifier_hidden and family.modality == "text" and cfg.classifier_hidden != cfg.d_model:
        problems.append(f"classifier_hidden={cfg.classifier_hidden} ({family.title}'s pooler is d_model="
                        f"{cfg.d_model} wide)")
    if cfg.pooling == "mean" and cfg.classifier_hidden:
        problems.append("a pooler after mean pooling (the pooler reads the first token)")
    if cfg.pooling == "mean" and family.modality == "image":
        problems.append("pooling='mean' (ViT has a CLS token)")
    return problems


def _tokenizer_problems(tokenizer: Optional[AnyTokenizer], family: HFFamily, cfg: ModelConfig) -> list[str]:
    if tokenizer is None:
        return []
    if family.modality == "image":
        return ["a tokenizer for an image model"]
    language_tokenizer = isinstance(tokenizer, (ByteBPETokenizer, CharTokenizer))
    if language_tokenizer != (family.arch == "causal_lm"):
        return [f"a {type(tokenizer).__name__} for a {family.title}"]
    if language_tokenizer:
        return [] if len(tokenizer) <= cfg.src_vocab_size else [
            f"a tokenizer with {len(tokenizer)} ids for a model with src_vocab_size={cfg.src_vocab_size}"]
    if tokenizer.pad_id != cfg.pad_id or tokenizer.vocab_size > cfg.src_vocab_size:
        return [f"a tokenizer with pad id {tokenizer.pad_id} and {tokenizer.vocab_size} ids for a model with "
                f"pad_id={cfg.pad_id} and src_vocab_size={cfg.src_vocab_size}"]
    return []


def _head_layout(family: HFFamily, cfg: ModelConfig) -> Optional[HeadLayout]:
    """The classification head the model's pooling and pooler match, or None (the encoder alone is exported)."""
    if cfg.pooling != "cls":
        return None
    return next((layout for layout in family.heads if layout.needs_pooler == bool(cfg.classifier_hidden)), None)


def _hf_config(family: HFFamily, model: nn.Module, cfg: ModelConfig, layout: Optional[HeadLayout],
               labels: Optional[list[str]]) -> dict[str, Any]:
    config = family.hf_config(cfg)
    architecture = layout.architectures[0] if layout is not None else family.export_model
    config["architectures"] = [architecture]
    if layout is not None:
        names = labels or [f"LABEL_{i}" for i in range(cfg.num_classes)]
        config["id2label"] = {str(i): name for i, name in enumerate(names)}
        config["label2id"] = {name: i for i, name in enumerate(names)}
    if isinstance(model, ImageClassifier):
        vcfg = model.config
        config.update(family.vision_hf_config(vcfg.image_height, vcfg.image_width, vcfg.channels, vcfg.patch_size))
        if cfg.classifier_hidden:
            config.update(pooler_output_size=cfg.classifier_hidden, pooler_act="tanh")
    return config


def _write_processor(directory: Path, model: ImageClassifier) -> None:
    """``ViTImageProcessor`` settings that give the model's own normalisation (pixels rescaled to [0, 1] first)."""
    cfg = model.config
    settings = {"image_processor_type": "ViTImageProcessor", "do_resize": True,
                "size": {"height": cfg.image_height, "width": cfg.image_width}, "resample": 2, "do_rescale": True,
                "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": list(cfg.pixel_mean),
                "image_std": list(cfg.pixel_std)}
    (directory / PROCESSOR_FILE).write_text(json.dumps(settings, indent=2) + "\n")


def _write_sentence_transformers(directory: Path, width: int) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (directory / ST_MODULES).write_text(json.dumps(modules, indent=2) + "\n")
    pooling_dir = directory / "1_Pooling"
    pooling_dir.mkdir(exist_ok=True)
    modes = {"word_embedding_dimension": width, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
             "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}
    (pooling_dir / "config.json").write_text(json.dumps(modes, indent=2) + "\n")
