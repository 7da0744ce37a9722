"""The BERT-family entry points of issue 6, now on the generic import of :mod:`interlayer.pretrained.hf`.

:func:`import_bert` returns ``(model, tokenizer)`` for any text family (BERT, ELECTRA, RoBERTa/XLM-R, DistilBERT);
:func:`export_bert` writes a BERT; :func:`pa_bert_section` is PA-BERT's method section (PA Sec. 4.1.2, Table 6);
:func:`load_checkpoint` and :func:`checkpoint_tokenizer` are the halves a fine-tuning run uses.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from torch import nn

from ..config import ModelConfig, config_from_dict
from ..errors import ConfigError
from .export import to_hf
from .families import SUPPORTED_MODEL_TYPES, BertFamily
from .hf import (ImportReport, PretrainedError, encoder_config, from_checkpoint, load_checkpoint_state,
                 read_checkpoint, restructuring_sections)
from .tokenization import PretrainedTokenizer

__all__ = ["ImportReport", "PA_BERT_ALPHA", "PretrainedError", "SUPPORTED_MODEL_TYPES", "bert_config",
           "checkpoint_tokenizer", "encoder_parameter_map", "export_bert", "import_bert", "load_checkpoint",
           "pa_bert_section"]

# PA App. B.2.2, Table 6: alpha of Eq. 4 for PA-BERT fine-tuning on each GLUE task.
PA_BERT_ALPHA = {"cola": 0.2, "sst2": 0.1, "mrpc": 0.2, "stsb": 0.4, "qqp": 0.2, "mnli": 0.4, "qnli": 0.4,
                 "rte": 0.2, "wnli": 0.2}
_BERT = BertFamily()


def encoder_parameter_map(n_layers: int) -> dict[str, str]:
    """HF BERT tensor name (without the ``bert.`` prefix) -> core parameter name, for the encoder proper."""
    return _BERT.layer_map(n_layers)


def bert_config(hf: dict[str, Any], pad_id: int, *, num_classes: int, pooling: str, pooler: bool,
                extra_sections: Optional[dict[str, Any]] = None, overrides: Optional[dict[str, Any]] = None,
                source: str = "checkpoint") -> ModelConfig:
    """The core config of a BERT ``config.json`` (:class:`~interlayer.pretrained.families.BertFamily`), plus
    method sections and the overrides :func:`import_bert` accepts."""
    fields = {**_BERT.core_fields(hf), "num_classes": num_classes, "pooling": pooling, "pad_id": pad_id,
              "classifier_hidden": hf["hidden_size"] if pooler else 0}
    return config_from_dict({**fields, **dict(overrides or {}), **dict(extra_sections or {})}, source=source)


def import_bert(directory: Union[str, Path], *, num_classes: Optional[int] = None, pooling: Optional[str] = None,
                pooler: Optional[bool] = None, extra_sections: Optional[dict[str, Any]] = None,
                overrides: Optional[dict[str, Any]] = None, reinitialise: bool = False
                ) -> tuple[nn.Module, PretrainedTokenizer]:
    """``(model, tokenizer)`` of a text checkpoint folder: :func:`~interlayer.pretrained.from_hf` with its options,
    refusing a folder without a tokenizer (fine-tuning needs one)."""
    checkpoint = read_checkpoint(directory)
    if checkpoint.family.modality != "text":
        raise PretrainedError(f"{directory} holds a {checkpoint.family.title}, not a text encoder; use from_hf")
    if checkpoint.tokenizer is None:
        raise PretrainedError(f"{directory}: " + " ".join(checkpoint.notes))
    model = from_checkpoint(checkpoint, num_classes=num_classes, pooling=pooling, pooler=pooler,
                            extra_sections=extra_sections, overrides=overrides, reinitialise=reinitialise)
    return model, model.tokenizer


def load_checkpoint(model: nn.Module, directory: Union[str, Path]) -> ImportReport:
    """Copy checkpoint ``directory``'s tensors into ``model``, built from a config the import made for it.

    Why: a fine-tuning run builds its model itself, after seeding, so that what the checkpoint lacks (PA's
    convolutions, a new head) gets the run's seeded initialisation; this is the loading half of the import (the
    same head policy, report and notes). ``torch.manual_seed(s)`` then ``build_model(cfg)`` and
    ``load_checkpoint`` give exactly the model of ``torch.manual_seed(s)`` then ``import_bert`` with that config's
    options. A config with a section that restructures pretrained weights was only built because the import was
    asked to re-initialise them (``reinitialise=True``), so they are re-initialised here too. The model is left in
    its current mode.
    """
    reinitialise = bool(restructuring_sections(encoder_config(model.config)))
    return load_checkpoint_state(model, read_checkpoint(directory), reinitialise=reinitialise)


def checkpoint_tokenizer(directory: Union[str, Path]) -> PretrainedTokenizer:
    """The checkpoint's tokenizer as :func:`import_bert` returns it (truncating to the position table at most)."""
    checkpoint = read_checkpoint(directory)
    if checkpoint.tokenizer is None:
        raise PretrainedError(f"{directory}: " + " ".join(checkpoint.notes))
    return checkpoint.tokenizer


def pa_bert_section(task: Optional[str] = None, **fields: Any) -> dict[str, Any]:
    """The ``predictive`` section of PA-BERT (PA Sec. 4.1.2): one 3x3 conv per block, alpha from Table 6.

    ``task`` is a GLUE task name (``"cola"``, ``"sst2"``, ...); None gives alpha = 0.2, "the best choice for most
    tasks" (App. B.2.2). ``fields`` override the section's other keys (e.g. ``init="dirac"``).
    """
    if task is not None and task.lower() not in PA_BERT_ALPHA:
        raise ConfigError(f"task={task!r} has no alpha in PA Table 6; choose one of {', '.join(PA_BERT_ALPHA)}")
    alpha = PA_BERT_ALPHA[task.lower()] if task is not None else 0.2
    return {"alpha": alpha, "conv_layers": 1, **fields}


def export_bert(model: nn.Module, tokenizer: PretrainedTokenizer, directory: Union[str, Path]) -> Path:
    """Write ``model`` as a Hugging Face BERT (``BertForSequenceClassification`` for ``pooling="cls"`` with the
    pooler, else ``BertModel``); :func:`~interlayer.pretrained.to_hf` with ``family="bert"``."""
    return to_hf(model, directory, tokenizer=tokenizer, family="bert")
