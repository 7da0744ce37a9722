"""Import and export Hugging Face BERT-family checkpoints on the core Transformer.

Why: the PA paper fine-tunes PA-BERT from the released BERT checkpoints (PA Sec. 4.1.2, Table 2, Appendix B.2.2:
"we load the pre-trained checkpoints ... For PA-BERT, the additional parameters are initialized randomly and
trained jointly during fine-tuning"). :func:`import_bert` does that for any method section: it builds the model
from the checkpoint's architecture plus ``extra_sections``, loads every pretrained tensor, and leaves the
parameters the methods add at their own initialisation, listing them in the :class:`ImportReport`.

BERT (Devlin et al. 2019) on the core: post-LN layers (``norm_first=False``), exact-erf GELU, learned absolute
positions from 0, token types as ``n_segments``, a LayerNorm after the summed embeddings, no ``sqrt(d)`` embedding
scale, LayerNorm eps from the config, the pooler ``tanh(W h_[CLS] + b)`` as ``classifier_hidden`` with
``pooling="cls"``, and the pad id of the vocabulary. ``BertForSequenceClassification``'s ``classifier`` is the
core's ``head`` (it reads the pooler's output after dropout, exactly as the core does).

Tensor names (the encoder prefix ``bert.``/``electra.`` of task checkpoints is optional)::

    embeddings.word_embeddings / position_embeddings / token_type_embeddings / LayerNorm
        -> encoder.embed.tokens / positions / segments / norm
    encoder.layer.i.attention.self.query / key / value  -> encoder.layers.i.self_attn.q_proj / k_proj / v_proj
    encoder.layer.i.attention.output.dense / LayerNorm  -> encoder.layers.i.self_attn.out_proj / attn_block.norm
    encoder.layer.i.intermediate.dense / output.dense   -> encoder.layers.i.ffn.fc1 / fc2
    encoder.layer.i.output.LayerNorm                    -> encoder.layers.i.ffn_block.norm
    pooler.dense -> pooler.0          classifier -> head (BertForSequenceClassification only)

Choices where the checkpoints leave room (each with its reason):

* **Supported types**: ``bert`` and ``electra`` with ``embedding_size == hidden_size`` (ELECTRA-Base/Large
  discriminators are BERT with another prefix). Others are refused with the reason: RoBERTa/XLM-R count positions
  from ``padding_idx + 1`` over non-padding tokens (the core's positions start at 0) and use byte-level BPE;
  DistilBERT has no token types and other names; ALBERT shares layers and factorises embeddings.
* **Pooler**: ``pooling="cls"`` uses BERT's pooler (the architecture BERT's classifiers were trained with). A
  checkpoint without pooler weights (e.g. exported from ``BertForMaskedLM``) gets a fresh one initialised as
  ``transformers`` does (normal, std ``initializer_range``; zero bias) and a warning. ``pooling=None`` reads a
  sentence-transformers ``Pooling`` config when present (all-MiniLM-L6-v2: mean pooling, no pooler); its final
  L2 normalisation is not applied (cosine similarities are unchanged).
* **Heads**: a ``BertForSequenceClassification`` classifier is loaded when ``num_classes`` matches it and the
  pooler is on; otherwise the head is new (``transformers``' init). Pre-training heads (``cls.*``), ELECTRA's
  discriminator and other task heads are skipped and listed under ``ignored``.
* **Methods that replace pretrained modules** (LW group-wise layers, the conv branch) or tie matrices the
  checkpoint holds as different weights (Crossformer hard guidance) cannot receive the checkpoint: the import
  fails naming the tensor, rather than silently dropping pretrained weights. Soft guidance (``crossformer.soft``, a
  fine-tuning regulariser), Predictive Attention and Multi-Pass only add parameters and load fine.
* **The model is returned in eval mode**, as ``transformers``' ``from_pretrained`` does; call ``.train()`` to
  fine-tune. Weights are copied into the model's fp32 parameters whatever the checkpoint's dtype.
"""
from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from ..build import build_model
from ..checkpoint import CheckpointError
from ..config import ModelConfig, config_from_dict
from ..core.config import ConfigError
from ..methods import METHODS
from .wordpiece import WordPieceTokenizer

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES: dict[str, str] = {"bert": "bert.", "electra": "electra."}  # model_type -> encoder prefix
ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}  # HF hidden_act -> core activation (HF "gelu" is the exact erf)
OVERRIDABLE = ("dropout", "attn_dropout", "act_dropout", "attn_impl")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# Buffers some exports include; they carry no trained values.
_BUFFERS = ("embeddings.position_ids",)
# HF tensor names inside these namespaces belong to the encoder: an unknown one there is an error, not a head.
_ENCODER_NAMESPACES = ("embeddings.", "encoder.", "pooler.")
_LAYER_PARTS = {"attention.self.query": "self_attn.q_proj", "attention.self.key": "self_attn.k_proj",
                "attention.self.value": "self_attn.v_proj", "attention.output.dense": "self_attn.out_proj",
                "attention.output.LayerNorm": "attn_block.norm", "intermediate.dense": "ffn.fc1",
                "output.dense": "ffn.fc2", "output.LayerNorm": "ffn_block.norm"}
_EMBEDDING_PARTS = {"embeddings.word_embeddings": "encoder.embed.tokens",
                    "embeddings.position_embeddings": "encoder.embed.positions",
                    "embeddings.token_type_embeddings": "encoder.embed.segments"}
_POOLER = {"pooler.dense.weight": "pooler.0.weight", "pooler.dense.bias": "pooler.0.bias"}
_HEAD = {"classifier.weight": "head.weight", "classifier.bias": "head.bias"}
_ST_MODULES = "modules.json"
# PA App. B.2.2, Table 6: alpha of Eq. 4 for PA-BERT fine-tuning on each GLUE task.
PA_BERT_ALPHA = {"cola": 0.2, "sst2": 0.1, "mrpc": 0.2, "stsb": 0.4, "qqp": 0.2, "mnli": 0.4, "qnli": 0.4,
                 "rte": 0.2, "wnli": 0.2}


class PretrainedError(CheckpointError):
    """A checkpoint directory that is not a supported BERT-family model, or a model that cannot become one."""


@dataclass
class ImportReport:
    """What :func:`import_bert` did with every tensor (core names for the model, HF names for the checkpoint)."""

    source: str
    loaded: list[str] = field(default_factory=list)  # model parameters that received a checkpoint tensor
    initialised: list[str] = field(default_factory=list)  # model parameters left at their own initialisation
    ignored: list[str] = field(default_factory=list)  # checkpoint tensors with no place in the model
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """What a run records (task.json): the counts, and by name what is new and what was left out."""
        return {"source": self.source, "counts": {"loaded": len(self.loaded), "initialised": len(self.initialised),
                                                  "ignored": len(self.ignored)},
                "initialised": list(self.initialised), "ignored": list(self.ignored), "notes": list(self.notes)}


def encoder_parameter_map(n_layers: int) -> dict[str, str]:
    """HF BERT tensor name (without the ``bert.`` prefix) -> core parameter name, for the encoder proper."""
    names = {f"{hf}.weight": f"{core}.weight" for hf, core in _EMBEDDING_PARTS.items()}
    names.update({"embeddings.LayerNorm.weight": "encoder.embed.norm.weight",
                  "embeddings.LayerNorm.bias": "encoder.embed.norm.bias"})
    for i in range(n_layers):
        for hf, core in _LAYER_PARTS.items():
            for kind in ("weight", "bias"):
                names[f"encoder.layer.{i}.{hf}.{kind}"] = f"encoder.layers.{i}.{core}.{kind}"
    return names


# ---------------------------------------------------------------------------------------------------- reading


def read_hf_config(directory: Union[str, Path]) -> dict[str, Any]:
    """``config.json`` of a supported checkpoint, checked for everything the core cannot represent."""
    directory = Path(directory)
    if not directory.is_dir():
        raise PretrainedError(f"{directory} is not a directory; pass a Hugging Face checkpoint directory "
                              "(config.json, model.safetensors or pytorch_model.bin, vocab.txt)")
    path = directory / "config.json"
    if not path.is_file():
        raise PretrainedError(f"{directory} has no config.json, so it is not a Hugging Face checkpoint")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise PretrainedError(f"{path} is not valid JSON: {err}") from None
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise PretrainedError(f"{path}: model_type={model_type!r} is not supported; supported BERT-family types: "
                              f"{', '.join(SUPPORTED_MODEL_TYPES)} (RoBERTa/XLM-R offset their positions by "
                              "padding_idx+1 and use BPE, DistilBERT and ALBERT have other layouts)")
    problems = _config_problems(hf)
    if problems:
        raise PretrainedError(f"{path}: this {model_type} variant cannot be represented: " + "; ".join(problems))
    return hf


def _config_problems(hf: dict[str, Any]) -> list[str]:
    needed = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size")
    problems = [f"{key} is missing" for key in needed if not isinstance(hf.get(key), int)]
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        problems.append(f"hidden_act={act!r} (the core has the exact-erf 'gelu' and 'relu'; tanh-approximated GELUs "
                        "such as 'gelu_new' would change every output)")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type={hf['position_embedding_type']!r} (only 'absolute' is supported)")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        problems.append("is_decoder/add_cross_attention is set (only bidirectional encoders are supported)")
    if hf.get("model_type") == "electra" and hf.get("embedding_size", hf.get("hidden_size")) != hf.get("hidden_size"):
        problems.append(f"embedding_size={hf['embedding_size']} differs from hidden_size={hf.get('hidden_size')} "
                        "(ELECTRA-Small's embeddings_project has no place in the core)")
    return problems


def read_weights(directory: Union[str, Path]) -> dict[str, Tensor]:
    """All tensors of the checkpoint, from safetensors or a ``.bin`` (``weights_only=True``), sharded or not."""
    directory = Path(directory)
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if name.endswith(".index.json"):
            shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
            return {k: v for shard in shards for k, v in _read_one(directory / shard).items()}
        return _read_one(path)
    present = sorted(p.name for p in directory.iterdir())
    raise PretrainedError(f"{directory} has no PyTorch weights: expected one of {', '.join(WEIGHT_FILES)}, found "
                          f"{present} (convert TensorFlow/Flax checkpoints with transformers first)")


def _read_one(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        return load_file(str(path))
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise PretrainedError(f"{path} does not hold a state dict (got {type(state).__name__})")
    return state


def normalise_names(state: dict[str, Tensor], model_type: str) -> dict[str, Tensor]:
    """Drop the task checkpoints' encoder prefix and rename TF-era LayerNorm ``gamma``/``beta``."""
    prefix = SUPPORTED_MODEL_TYPES[model_type]
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        name = name[len(prefix):] if name.startswith(prefix) else name
        if ".LayerNorm." in name:
            name = name.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
        out[name] = tensor
    return out


def _sentence_transformers_pooling(directory: Path) -> Optional[str]:
    """``mean``/``cls`` from a sentence-transformers ``Pooling`` module config, or None when there is none."""
    modules_path = directory / _ST_MODULES
    if not modules_path.is_file():
        return None
    for module in json.loads(modules_path.read_text()):
        if str(module.get("type", "")).endswith("Pooling"):
            config_path = directory / module.get("path", "") / "config.json"
            modes = json.loads(config_path.read_text()) if config_path.is_file() else {}
            chosen = [mode for mode, on in modes.items() if mode.startswith("pooling_mode_") and on]
            if chosen == ["pooling_mode_mean_tokens"]:
                return "mean"
            if chosen == ["pooling_mode_cls_token"]:
                return "cls"
            raise PretrainedError(f"{config_path}: pooling {chosen} has no core equivalent; pass pooling='cls' or "
                                  "pooling='mean' to import_bert")
    return None


# ---------------------------------------------------------------------------------------------------- importing


def import_bert(directory: Union[str, Path], *, num_classes: Optional[int] = None, pooling: Optional[str] = None,
                pooler: Optional[bool] = None, extra_sections: Optional[dict[str, Any]] = None,
                overrides: Optional[dict[str, Any]] = None) -> tuple[nn.Module, WordPieceTokenizer]:
    """Build an ``EncoderClassifier`` from a Hugging Face BERT-family directory and load its weights.

    * ``num_classes``: the head's classes; None takes a ``BertForSequenceClassification`` head's (loaded), else
      the config's ``num_labels`` (2 by default, as ``transformers``) with a new head.
    * ``pooling``: ``"cls"`` or ``"mean"``; None reads a sentence-transformers Pooling config, else ``"cls"``.
    * ``pooler``: BERT's ``tanh`` pooler before the head; None means on for ``"cls"`` pooling (except a
      sentence-transformers CLS pooling, which has none) and off for ``"mean"``.
    * ``extra_sections``: method sections, e.g. ``{"predictive": {"alpha": 0.2}}`` (PA-BERT, App. B.2.2) or
      ``{"crossformer": {"soft": ["kq"]}}``; their new parameters keep their initialisation.
    * ``overrides``: core fields that do not change the pretrained architecture (:data:`OVERRIDABLE`).

    Returns ``(model, tokenizer)`` with the model in eval mode; ``model.import_report`` is an
    :class:`ImportReport`, also logged at INFO level.
    """
    directory = Path(directory)
    hf = read_hf_config(directory)
    tokenizer = _tokenizer_for(directory, hf)
    state = normalise_names(read_weights(directory), hf["model_type"])
    pooling, pooler = _pooling_plan(directory, pooling, pooler)
    ckpt_classes = _checkpoint_classes(hf, state)
    num_classes = num_classes if num_classes is not None else (ckpt_classes or _num_labels(hf))
    cfg = bert_config(hf, tokenizer.pad_id, num_classes=num_classes, pooling=pooling, pooler=pooler,
                      extra_sections=extra_sections, overrides=overrides, source=str(directory))
    model = build_model(cfg)
    model.import_report = _load_checkpoint_state(model, directory, hf, tokenizer, state)
    return model.eval(), tokenizer


def load_checkpoint(model: nn.Module, directory: Union[str, Path]) -> ImportReport:
    """Copy checkpoint ``directory``'s tensors into ``model``, built from a config :func:`import_bert` made for it.

    Why: a fine-tuning run builds its model itself, after seeding, so that what the checkpoint lacks (PA's
    convolutions, a new head) gets the run's seeded initialisation; this is the loading half of
    :func:`import_bert` (the same head policy, report and notes). ``torch.manual_seed(s)`` then
    ``build_model(cfg)`` and ``load_checkpoint`` give exactly the model of ``torch.manual_seed(s)`` then
    ``import_bert`` with that config's options. The model is left in its current mode.
    """
    directory = Path(directory)
    hf = read_hf_config(directory)
    state = normalise_names(read_weights(directory), hf["model_type"])
    return _load_checkpoint_state(model, directory, hf, _tokenizer_for(directory, hf), state)


def checkpoint_tokenizer(directory: Union[str, Path]) -> WordPieceTokenizer:
    """The checkpoint's tokenizer as :func:`import_bert` returns it (truncating to the position table at most)."""
    directory = Path(directory)
    return _tokenizer_for(directory, read_hf_config(directory))


def _load_checkpoint_state(model: nn.Module, directory: Path, hf: dict[str, Any], tokenizer: WordPieceTokenizer,
                           state: dict[str, Tensor]) -> ImportReport:
    """Load ``state`` with the head policy of :func:`import_bert`; the report is logged at INFO level."""
    cfg: ModelConfig = model.config
    ckpt_classes = _checkpoint_classes(hf, state)
    load_head = ckpt_classes == cfg.num_classes and bool(cfg.classifier_hidden) and cfg.pooling == "cls"
    report = load_bert_state(model, state, load_head=load_head, source=str(directory),
                             init_std=float(hf.get("initializer_range", 0.02)))
    report.notes += _notes(hf, tokenizer, cfg, ckpt_classes if not load_head else None)
    log.info("imported %s: %d tensors loaded, initialised %s, ignored %s; %s", directory, len(report.loaded),
             report.initialised, report.ignored, " ".join(report.notes))
    return report


def _tokenizer_for(directory: Path, hf: dict[str, Any]) -> WordPieceTokenizer:
    """The checkpoint's tokenizer, truncating to the position table at most."""
    tokenizer = WordPieceTokenizer.from_pretrained(directory, max_length=hf["max_position_embeddings"])
    if tokenizer.vocab_size > hf["vocab_size"]:
        raise PretrainedError(f"{directory}: the tokenizer has {tokenizer.vocab_size} ids but the embedding table "
                              f"only {hf['vocab_size']} rows (vocab_size)")
    return tokenizer


def _pooling_plan(directory: Path, pooling: Optional[str], pooler: Optional[bool]) -> tuple[str, bool]:
    """Resolve ``pooling``/``pooler`` defaults (see :func:`import_bert`)."""
    st_pooling = _sentence_transformers_pooling(directory)
    pooling = pooling or st_pooling or "cls"
    if pooler is None:
        pooler = pooling == "cls" and st_pooling != "cls"
    return pooling, pooler


def _notes(hf: dict[str, Any], tokenizer: WordPieceTokenizer, cfg: ModelConfig, unused_classes: Optional[int]
           ) -> list[str]:
    """What the import could not carry over exactly, in words."""
    notes = []
    if unused_classes:
        notes.append(f"the checkpoint's {unused_classes}-class classifier was not loaded (num_classes="
                     f"{cfg.num_classes}, pooling={cfg.pooling!r}, pooler={bool(cfg.classifier_hidden)}): the head "
                     "is new")
    if hf.get("pad_token_id", tokenizer.pad_id) != tokenizer.pad_id:
        notes.append(f"pad id {tokenizer.pad_id} is the vocabulary's {tokenizer.special_tokens['pad_token']}, not "
                     f"config.json's pad_token_id={hf['pad_token_id']}")
    if hf.get("classifier_dropout") not in (None, hf.get("hidden_dropout_prob")):
        notes.append(f"classifier_dropout={hf['classifier_dropout']} is not used: the core's head dropout is "
                     f"dropout={cfg.dropout}")
    return notes


def _checkpoint_classes(hf: dict[str, Any], state: dict[str, Tensor]) -> Optional[int]:
    """Classes of a ``BertForSequenceClassification`` head in the checkpoint, else None."""
    architectures = hf.get("architectures") or []
    is_classifier = any(a == "BertForSequenceClassification" for a in architectures)
    if not is_classifier or "classifier.weight" not in state or state["classifier.weight"].dim() != 2:
        return None
    classes = state["classifier.weight"].shape[0]
    if classes < 2:
        raise PretrainedError(f"the checkpoint's classifier has {classes} output (regression); interlayer "
                              "classifiers need num_classes >= 2: pass num_classes=N to start a new head")
    return classes


def _num_labels(hf: dict[str, Any]) -> int:
    labels = hf.get("id2label")
    return len(labels) if labels else int(hf.get("num_labels", 2))


def bert_config(hf: dict[str, Any], pad_id: int, *, num_classes: int, pooling: str, pooler: bool,
                extra_sections: Optional[dict[str, Any]] = None, overrides: Optional[dict[str, Any]] = None,
                source: str = "checkpoint") -> ModelConfig:
    """The core config of a BERT ``config.json`` (see the module docstring), plus method sections."""
    sections = dict(extra_sections or {})
    method_names = [m.name for m in METHODS]
    for name in sections:
        if name not in method_names:
            raise ConfigError(f"extra_sections: {name!r} is not a method section; valid: {', '.join(method_names)}"
                              " (core fields go in overrides)")
    overrides = dict(overrides or {})
    for key in overrides:
        if key not in OVERRIDABLE:
            raise ConfigError(f"overrides: {key!r} cannot be changed on a pretrained BERT (it would change what "
                              f"the weights compute); changeable: {', '.join(OVERRIDABLE)}")
    fields: dict[str, Any] = dict(
        arch="encoder_classifier", src_vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"], d_ffn=hf["intermediate_size"], enc_layers=hf["num_hidden_layers"],
        activation=ACTIVATIONS[hf.get("hidden_act", "gelu")], norm_first=False,
        layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)), bias=True, positions="learned",
        max_positions=hf["max_position_embeddings"], embed_scale=False, embed_layer_norm=True,
        n_segments=hf["type_vocab_size"], pad_id=pad_id, dropout=float(hf.get("hidden_dropout_prob", 0.1)),
        attn_dropout=float(hf.get("attention_probs_dropout_prob", 0.1)), act_dropout=0.0, num_classes=num_classes,
        pooling=pooling, classifier_hidden=hf["hidden_size"] if pooler else 0)
    return config_from_dict({**fields, **overrides, **sections}, source=source)


def load_bert_state(model: nn.Module, state: dict[str, Tensor], *, load_head: bool = False,
                    source: str = "checkpoint", init_std: float = 0.02) -> ImportReport:
    """Copy a (name-normalised) BERT state dict into ``model``; see :func:`import_bert` for the policy.

    Raises :class:`PretrainedError` when an encoder tensor is missing from the checkpoint, has no place or
    another shape in the model, or two different tensors would land in one tied parameter.
    """
    cfg = model.config
    mapping = encoder_parameter_map(cfg.enc_layers)
    missing = [name for name in mapping if name not in state]
    if missing:
        raise PretrainedError(f"{source} lacks BERT encoder tensors {_first(missing)} (for the {cfg.enc_layers} "
                              f"layers its config declares); found e.g. {_first(sorted(state))}")
    mapping.update({k: v for k, v in _POOLER.items() if k in state and cfg.classifier_hidden})
    if load_head:
        mapping.update(_HEAD)
    unexpected = [k for k in state if k.startswith(_ENCODER_NAMESPACES) and k not in mapping
                  and k not in _BUFFERS and k not in _POOLER]
    if unexpected:
        raise PretrainedError(f"{source} has encoder tensors this BERT layout does not know: {_first(unexpected)}")
    params = dict(model.named_parameters(remove_duplicate=False))
    filled: dict[int, str] = {}
    for hf_name, core_name in mapping.items():
        _copy_into(params, hf_name, core_name, state[hf_name], filled, source, cfg)
    report = ImportReport(source=source, loaded=sorted(set(mapping.values())),
                          ignored=sorted(k for k in state if k not in mapping))
    canonical = {id(p): n for n, p in reversed(list(params.items()))}
    report.initialised = [name for pid, name in sorted(canonical.items(), key=lambda x: x[1]) if pid not in filled]
    _init_fresh_heads(model, report, init_std)
    return report


def _copy_into(params: dict[str, nn.Parameter], hf_name: str, core_name: str, tensor: Tensor,
               filled: dict[int, str], source: str, cfg: ModelConfig) -> None:
    if core_name not in params:
        raise PretrainedError(f"{source}: {hf_name} has no place in this model ({core_name} does not exist): "
                              f"{_methods(cfg)} replaced the pretrained module")
    param = params[core_name]
    if param.shape != tensor.shape:
        raise PretrainedError(f"{source}: {hf_name} has shape {tuple(tensor.shape)} but {core_name} expects "
                              f"{tuple(param.shape)} ({_methods(cfg)} changed the module)")
    earlier = filled.get(id(param))
    with torch.no_grad():
        if earlier is not None and not torch.equal(param, tensor.to(param.dtype)):
            raise PretrainedError(f"{source}: {core_name} is tied to the parameter that received {earlier}, but "
                                  f"{hf_name} holds different pretrained values; {_methods(cfg)} ties matrices "
                                  "the checkpoint keeps apart (use crossformer.soft to guide them instead)")
        param.copy_(tensor)
    filled[id(param)] = hf_name


def _init_fresh_heads(model: nn.Module, report: ImportReport, std: float) -> None:
    """A pooler/head the checkpoint did not provide: ``transformers``' init (normal(0, std), zero bias)."""
    for module_name, module in (("pooler.0", model.pooler[0] if model.pooler is not None else None),
                                ("head", model.head)):
        if module is None or f"{module_name}.weight" not in report.initialised:
            continue
        nn.init.normal_(module.weight, std=std)
        nn.init.zeros_(module.bias)
        if module_name == "pooler.0":
            warnings.warn(f"{report.source} has no pooler weights: the BERT pooler was initialised randomly "
                          "(fine-tune before use, or import with pooling='mean')", stacklevel=4)
            report.notes.append("the pooler was initialised randomly (not in the checkpoint)")


def _methods(cfg: ModelConfig) -> str:
    names = [m.name for m, _ in cfg.sections()]
    return f"the method section(s) {', '.join(names)}" if names else "the config"


def _first(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" ... ({len(names)} in all)" if len(names) > n else "")


def pa_bert_section(task: Optional[str] = None, **fields: Any) -> dict[str, Any]:
    """The ``predictive`` section of PA-BERT (PA Sec. 4.1.2): one 3x3 conv per block, alpha from Table 6.

    ``task`` is a GLUE task name (``"cola"``, ``"sst2"``, ...); None gives alpha = 0.2, "the best choice for most
    tasks" (App. B.2.2). ``fields`` override the section's other keys (e.g. ``init="dirac"``).
    """
    if task is not None and task.lower() not in PA_BERT_ALPHA:
        raise ConfigError(f"task={task!r} has no alpha in PA Table 6; choose one of {', '.join(PA_BERT_ALPHA)}")
    alpha = PA_BERT_ALPHA[task.lower()] if task is not None else 0.2
    return {"alpha": alpha, "conv_layers": 1, **fields}


# ---------------------------------------------------------------------------------------------------- exporting


def export_bert(model: nn.Module, tokenizer: WordPieceTokenizer, directory: Union[str, Path]) -> Path:
    """Write a ``transformers``-loadable BERT directory: config.json, model.safetensors and tokenizer files.

    ``pooling="cls"`` with the pooler is saved as ``BertForSequenceClassification`` (``bert.`` prefix, the head as
    ``classifier``), so ``AutoModelForSequenceClassification`` reproduces the logits. Other pooling is saved as a
    ``BertModel`` (plus a sentence-transformers Pooling config for mean pooling); its head has no ``transformers``
    equivalent and is left out with a warning. Models whose forward BERT cannot compute (method sections other
    than Crossformer, whose tied matrices are written untied, which computes the same) are refused.
    """
    cfg: ModelConfig = model.config
    _check_exportable(cfg, tokenizer)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    classifier = cfg.pooling == "cls" and cfg.classifier_hidden > 0
    names = encoder_parameter_map(cfg.enc_layers)
    if cfg.classifier_hidden:
        names.update(_POOLER)
    if classifier:
        names.update(_HEAD)
    params = dict(model.named_parameters(remove_duplicate=False))
    prefix = "bert." if classifier else ""
    tensors = {(prefix if hf not in _HEAD else "") + hf: params[core].detach().clone().contiguous()
               for hf, core in names.items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(_hf_config(cfg, classifier), indent=2) + "\n")
    tokenizer.save_pretrained(directory)
    if cfg.pooling == "mean":
        _write_sentence_transformers(directory, cfg.d_model)
    if not classifier:
        warnings.warn(f"{cfg.pooling!r} pooling without BERT's pooler has no transformers classifier: the encoder is "
                      "exported as BertModel (with a sentence-transformers Pooling config for mean pooling) and the "
                      "classification head is left out", stacklevel=2)
    return directory


def _check_exportable(cfg: ModelConfig, tokenizer: WordPieceTokenizer) -> None:
    required = {"arch": "encoder_classifier", "norm_first": False, "positions": "learned", "embed_scale": False,
                "embed_layer_norm": True, "bias": True}
    problems = [f"{key}={getattr(cfg, key)!r} (BERT has {value!r})" for key, value in required.items()
                if getattr(cfg, key) != value]
    if cfg.qk_dim not in (None, cfg.d_model):
        problems.append(f"qk_dim={cfg.qk_dim} (BERT's queries and keys are d_model={cfg.d_model} wide)")
    if cfg.n_segments < 1:
        problems.append("n_segments=0 (BERT has token-type embeddings)")
    if cfg.classifier_hidden not in (0, cfg.d_model):
        problems.append(f"classifier_hidden={cfg.classifier_hidden} (BERT's pooler is d_model={cfg.d_model} wide)")
    if cfg.pooling == "mean" and cfg.classifier_hidden:
        problems.append("a pooler after mean pooling (BERT's pooler reads the [CLS] token)")
    problems += [f"the {m.name} section (BERT has no such computation)" for m, _ in cfg.sections()
                 if m.name != "crossformer"]
    if tokenizer.pad_id != cfg.pad_id or tokenizer.vocab_size > cfg.src_vocab_size:
        problems.append(f"a tokenizer with pad id {tokenizer.pad_id} and {tokenizer.vocab_size} ids for a model "
                        f"with pad_id={cfg.pad_id} and src_vocab_size={cfg.src_vocab_size}")
    if problems:
        raise PretrainedError("cannot export as a Hugging Face BERT: " + "; ".join(problems))


def _hf_config(cfg: ModelConfig, classifier: bool) -> dict[str, Any]:
    hf: dict[str, Any] = {
        "architectures": ["BertForSequenceClassification" if classifier else "BertModel"], "model_type": "bert",
        "vocab_size": cfg.src_vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.enc_layers,
        "num_attention_heads": cfg.n_heads, "intermediate_size": cfg.d_ffn, "hidden_act": cfg.activation,
        "hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.attn_dropout,
        "max_position_embeddings": cfg.max_positions, "type_vocab_size": cfg.n_segments,
        "initializer_range": 0.02, "layer_norm_eps": cfg.layer_norm_eps, "pad_token_id": cfg.pad_id,
        "position_embedding_type": "absolute", "classifier_dropout": None}
    if classifier:
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_classes)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_classes)}
    return hf


def _write_sentence_transformers(directory: Path, width: int) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (directory / _ST_MODULES).write_text(json.dumps(modules, indent=2) + "\n")
    pooling_dir = directory / "1_Pooling"
    pooling_dir.mkdir(exist_ok=True)
    modes = {"word_embedding_dimension": width, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
             "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}
    (pooling_dir / "config.json").write_text(json.dumps(modes, indent=2) + "\n")
