"""The ``transformers`` configuration class of interlayer models: ``model_type: "interlayer"`` in ``config.json``.

A folder ``interlayer export`` writes for a model no ``transformers`` family computes (ResFormer, Predictive
Attention, hyper-connections, ...) has a ``config.json`` that ``transformers.AutoConfig`` reads once this class is
registered (``import interlayer`` does it: :mod:`~interlayer.pretrained.transformers_classes.auto`), or from the
folder's own copy of this module (``interlayer export --with-code``):

* ``interlayer``: ``{"model_type": ..., "config": {...}}``, the interlayer model type (the registry's family:
  ``transformer``, ``vit``, ...) and the model's full interlayer config, from which the model is rebuilt (methods
  and ties included): the source of truth;
* beside it, the ``transformers`` names tools read (``vocab_size``, ``hidden_size``, ``num_hidden_layers``,
  ``num_attention_heads``, ``intermediate_size``, ``max_position_embeddings``, ``id2label``,
  ``tie_word_embeddings``, and GPT-2's names of the sizes, ``n_embd``, ``n_layer``, ``n_head``, ``n_inner``,
  ``n_positions``, as views of them), copies for information: changing them changes nothing;
* the settings every ``transformers`` config has, None when not given: ``bos``/``eos``/``pad_token_id`` (what
  ``generate`` and a pipeline's padding read: ``tokenizer.pad_token_id = model.config.eos_token_id`` works), and
  ``use_cache`` (True, as GPT-2's: interlayer's ``generate`` reads its own key/value cache).

``Trainer.predict`` and ``evaluate`` return the logits alone for every model: the extra output fields
(``aux_losses``, ``lm_loss``) are :attr:`InterlayerConfig.keys_to_ignore_at_inference`.

This module needs only ``transformers`` (no interlayer import), so that a folder's copy of it loads without
interlayer installed.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from transformers import PretrainedConfig

MODEL_TYPE = "interlayer"
# Called (and emptied) when the first InterlayerConfig is made: interlayer registers its model classes with
# transformers then (pretrained/transformers_classes/auto.py), when transformers is imported and in use. A folder's
# copy stays empty.
ON_FIRST_USE: list[Callable[[], None]] = []


class InterlayerConfig(PretrainedConfig):
    """``config.json`` of an interlayer model for ``transformers`` (module docstring)."""

    model_type = MODEL_TYPE
    # GPT-2's (and nanoGPT's) names of the sizes, read and written through transformers' generic ones
    attribute_map = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
                     "n_inner": "intermediate_size", "n_positions": "max_position_embeddings"}
    # output fields beside the logits that Trainer.predict/evaluate would otherwise return with them
    keys_to_ignore_at_inference = ["past_key_values", "aux_losses", "lm_loss"]

    def __init__(self, interlayer: Optional[dict[str, Any]] = None, bos_token_id: Optional[int] = None,
                 eos_token_id: Optional[int] = None, pad_token_id: Optional[int] = None, use_cache: bool = True,
                 **kwargs: Any) -> None:
        while ON_FIRST_USE:
            ON_FIRST_USE.pop()()
        self.interlayer = dict(interlayer or {})
        self.bos_token_id, self.eos_token_id, self.pad_token_id = bos_token_id, eos_token_id, pad_token_id
        self.use_cache = use_cache
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
