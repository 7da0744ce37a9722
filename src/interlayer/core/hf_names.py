"""``transformers``' names for a model's configuration, on :class:`~interlayer.core.config.TransformerConfig`.

Code written for ``transformers`` reads ``model.config.vocab_size``, ``hidden_size``, ``num_hidden_layers``,
``num_labels``, ``eos_token_id`` ... and some of it writes a few (``Trainer`` sets ``use_cache``; its
``align_special_tokens`` the special token ids; ``resize_token_embeddings`` the vocabulary size). The config stays
interlayer's dataclass (its fields are what is saved, validated and overridden); :class:`HFConfigNames` adds
those names as properties:

* **views of fields** (:data:`FIELD_NAMES`), read and written through: ``vocab_size`` = ``src_vocab_size``,
  ``hidden_size`` = ``d_model``, ``num_hidden_layers`` = ``enc_layers`` (the layers of the stack a language model
  or classifier runs; an encoder-decoder's encoder), ``num_attention_heads`` = ``n_heads``, ``intermediate_size``
  = ``d_ffn``, ``max_position_embeddings`` = ``max_positions``, ``hidden_act`` = ``activation``, ``num_labels`` =
  ``num_classes``, ``tie_word_embeddings`` = ``tie_output``, and GPT-2's names, which nanoGPT shares: ``n_layer``,
  ``n_head``, ``n_embd``, ``n_inner``, ``n_positions``. The same names are accepted as input wherever a config is
  given (a config file, ``--set``, ``create_model(..., n_layer=4)``): :data:`FIELD_ALIASES`, which the coercer
  reads (:func:`interlayer.config_io.dataclass_from_dict`); a config is saved under its own field names. As an
  override (``--set``, ``create_model``'s keywords), ``n_embd`` also scales the FFN to 4 x ``n_embd`` as nanoGPT
  and GPT-2 do, unless ``d_ffn`` (``n_inner``, ``intermediate_size``) is given too (:data:`FIELD_IMPLIED`); Read only:
  ``model_type`` (``"interlayer"``, what an interlayer folder's ``config.json`` says for ``transformers``),
  ``is_encoder_decoder``;
* **settings a run or an import gives, not fields**: ``bos_token_id``, ``eos_token_id``, ``pad_token_id`` (by
  default ``pad_id`` for models with a padding token, None for a language model, which pads with a mask),
  ``id2label``/``label2id`` (default ``LABEL_0`` ...), ``use_cache`` (True), kept beside the fields (not saved in
  interlayer's ``config.json``; an export writes them where ``transformers`` reads them, and loading an export
  gives them back);
* ``get_text_config()`` (the config itself), ``output_attentions``/``output_hidden_states``/``return_dict``
  (HF's defaults: False, False, True; interlayer models take them per call).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

# config.json's model_type for transformers (pretrained/transformers_classes/configuration.py)
MODEL_TYPE = "interlayer"
# Other libraries' name of a field -> (the field, what it is): transformers' generic names and GPT-2's (nanoGPT's)
FIELD_NAMES: dict[str, tuple[str, str]] = {
    "vocab_size": ("src_vocab_size", "the token table's rows"),
    "hidden_size": ("d_model", "the model width"),
    "num_hidden_layers": ("enc_layers", "the layers of the (encoder) stack"),
    "num_attention_heads": ("n_heads", "attention heads per layer"),
    "intermediate_size": ("d_ffn", "the feed-forward hidden width"),
    "max_position_embeddings": ("max_positions", "the longest input the positions number"),
    "hidden_act": ("activation", "the feed-forward activation"),
    "num_labels": ("num_classes", "a classifier's classes"),
    "tie_word_embeddings": ("tie_output", "whether the output projection is the token table"),
    "n_layer": ("enc_layers", "GPT-2's (and nanoGPT's) name of num_hidden_layers"),
    "n_head": ("n_heads", "GPT-2's (and nanoGPT's) name of num_attention_heads"),
    "n_embd": ("d_model", "GPT-2's (and nanoGPT's) name of hidden_size"),
    "n_inner": ("d_ffn", "GPT-2's name of intermediate_size"),
    "n_positions": ("max_positions", "GPT-2's name of max_position_embeddings"),
}
# The input keys the coercer accepts for a field besides its own name (name -> field)
FIELD_ALIASES: dict[str, str] = {name: field for name, (field, _) in FIELD_NAMES.items()}
# What an override under one of those names also sets, unless the field is given itself (under any name): nanoGPT's
# MLP is always 4 x n_embd wide, and GPT-2's n_inner defaults to it, so `--set n_embd=32` scales the FFN as there
# (interlayer's own d_model changes only the width). Read by interlayer.config_io.set_dotted.
FIELD_IMPLIED: dict[str, Callable[[Any], dict[str, Any]]] = {"n_embd": lambda width: {"d_ffn": 4 * width}}
SETTINGS = ("bos_token_id", "eos_token_id", "pad_token_id", "id2label", "label2id", "use_cache")


def _view(field: str, doc: str, writable: bool = True) -> property:
    def get(self: Any) -> Any:
        return getattr(self, field)

    def set_(self: Any, value: Any) -> None:
        setattr(self, field, value)

    return property(get, set_ if writable else None, doc=f"{doc} (``{field}``)")


def _setting(name: str, default: Callable[[Any], Any], doc: str) -> property:
    def get(self: Any) -> Any:
        settings = self.__dict__.get("_hf_settings", {})
        return settings[name] if name in settings else default(self)

    def set_(self: Any, value: Any) -> None:
        self.__dict__.setdefault("_hf_settings", {})[name] = value

    return property(get, set_, doc=doc)


def _labels(cfg: Any) -> Optional[dict[int, str]]:
    return {i: f"LABEL_{i}" for i in range(cfg.num_classes)} if cfg.num_classes else None


def _with_views(cls: type) -> type:
    """``cls`` with a property per :data:`FIELD_NAMES` entry, a view of its field."""
    for name, (field, doc) in FIELD_NAMES.items():
        setattr(cls, name, _view(field, doc))
    return cls


@_with_views
class HFConfigNames:
    """The module docstring's names as properties of a config dataclass with the core's fields."""

    FIELD_ALIASES = FIELD_ALIASES  # read by interlayer.config_io.dataclass_from_dict
    FIELD_IMPLIED = FIELD_IMPLIED  # read by interlayer.config_io.set_dotted
    model_type = property(lambda self: MODEL_TYPE, doc="what transformers' AutoConfig knows interlayer models by")
    is_encoder_decoder = property(lambda self: self.arch == "encoder_decoder")
    bos_token_id = _setting("bos_token_id", lambda cfg: None, "the first token a language model generates from")
    eos_token_id = _setting("eos_token_id", lambda cfg: None, "the token that ends a generated sequence")
    pad_token_id = _setting("pad_token_id", lambda cfg: None if cfg.arch == "causal_lm" else cfg.pad_id,
                            "the padding token (a language model pads with a mask: None)")
    id2label = _setting("id2label", _labels, "class id -> name")
    label2id = _setting("label2id", lambda cfg: {v: k for k, v in (_labels(cfg) or {}).items()} or None,
                        "class name -> id")
    use_cache = _setting("use_cache", lambda cfg: True, "transformers.Trainer sets it; generation uses the KV "
                         "cache whenever the model supports it")
    output_attentions = False
    output_hidden_states = False
    return_dict = True
    use_return_dict = True

    def get_text_config(self, *args: Any, **kwargs: Any) -> "HFConfigNames":
        """The config itself (``transformers`` asks composite configs for their text part)."""
        return self

    def hf_settings(self) -> dict[str, Any]:
        """The :data:`SETTINGS` given to this config (by an import, a run, ``transformers``), by name."""
        return dict(self.__dict__.get("_hf_settings", {}))
