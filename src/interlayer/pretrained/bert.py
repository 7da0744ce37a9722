"""The BERT-family entry points of issue 6, on the generic import of :mod:`interlayer.pretrained.hf`.

:func:`import_bert` returns ``(model, tokenizer)`` for any text family (BERT, ELECTRA, RoBERTa/XLM-R, DistilBERT);
:func:`export_bert` writes a BERT; :func:`pa_bert_section` is PA-BERT's method section (PA Sec. 4.1.2, Table 6).
The halves a fine-tuning run of any family uses (:func:`~interlayer.pretrained.hf_load.load_checkpoint`,
:func:`~interlayer.pretrained.hf_checkpoint.checkpoint_tokenizer`) are in the generic module.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from torch import nn

from ..config import ModelConfig, config_from_dict
from ..data.tokenizers.pretrained import PretrainedTokenizer
from ..errors import ConfigError, PretrainedError
from .export import to_hf
from .families import BertFamily
from .hf import from_checkpoint
from .hf_checkpoint import read_checkpoint

__all__ = ["PA_BERT_ALPHA", "bert_config", "encoder_parameter_map", "export_bert", "import_bert", "pa_bert_section"]

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
    """``(model, tokenizer)`` of a text checkpoint folder: :func:`~interlayer.pretrained.hf.from_hf` with its options,
    refusing a folder without a tokenizer (fine-tuning needs one)."""
    checkpoint = read_checkpoint(directory)
    if checkpoint.family.modality != "text":
        raise PretrainedError(f"{directory} holds a {checkpoint.family.title}, not a text encoder; use from_hf")
    if checkpoint.tokenizer is None:
        raise PretrainedError(f"{directory}: " + " ".join(checkpoint.notes))
    model = from_checkpoint(checkpoint, num_classes=num_classes, pooling=pooling, pooler=pooler,
                            extra_sections=extra_sections, overrides=overrides, reinitialise=reinitialise)
    return model, model.tokenizer


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
    pooler, else ``BertModel``); :func:`~interlayer.pretrained.export.to_hf` with ``family="bert"``."""
    return to_hf(model, directory, tokenizer=tokenizer, family="bert")
