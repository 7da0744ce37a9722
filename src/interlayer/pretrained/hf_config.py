"""The ``transformers`` configuration class of interlayer models: ``model_type: "interlayer"`` in ``config.json``.

A folder ``interlayer export`` writes for a model no ``transformers`` family computes (ResFormer, Predictive
Attention, hyper-connections, ...) has a ``config.json`` that ``transformers.AutoConfig`` reads once this class is
registered (``import interlayer`` does it: :mod:`interlayer.pretrained.hf_auto`), or from the folder's own copy of
this module (``interlayer export --with-code``):

* ``interlayer``: ``{"model_type": ..., "config": {...}}``, the interlayer model type (the registry's family:
  ``transformer``, ``vit``, ...) and the model's full interlayer config, from which the model is rebuilt (methods
  and ties included): the source of truth;
* beside it, the ``transformers`` names tools read (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
  ``num_attention_heads``, ``max_position_embeddings``, ``bos``/``eos``/``pad_token_id``, ``id2label``,
  ``tie_word_embeddings``), copies for information: changing them changes nothing.

This module needs only ``transformers`` (no interlayer import), so that a folder's copy of it loads without
interlayer installed.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from transformers import PretrainedConfig

MODEL_TYPE = "interlayer"
# Called (and emptied) when the first InterlayerConfig is made: interlayer registers its model classes with
# transformers then (pretrained/hf_auto.py), when transformers is imported and in use. A folder's copy stays empty.
ON_FIRST_USE: list[Callable[[], None]] = []


class InterlayerConfig(PretrainedConfig):
    """``config.json`` of an interlayer model for ``transformers`` (module docstring)."""

    model_type = MODEL_TYPE

    def __init__(self, interlayer: Optional[dict[str, Any]] = None, **kwargs: Any) -> None:
        while ON_FIRST_USE:
            ON_FIRST_USE.pop()()
        self.interlayer = dict(interlayer or {})
        super().__init__(**kwargs)

    @property
    def interlayer_model_type(self) -> str:
        """The interlayer family that rebuilds the model (``transformer`` for language models and text
        classifiers)."""
        return str(self.interlayer.get("model_type", "transformer"))

    @property
    def interlayer_config(self) -> dict[str, Any]:
        """The model's interlayer config, as ``config.to_dict()`` gives it."""
        return dict(self.interlayer.get("config", {}))
