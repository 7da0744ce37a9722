"""Named presets (fairseq's ``transformer_iwslt_de_en`` style) and ``create_model`` (timm style).

A preset is a plain dict of config fields with a description and the paper reference it reproduces. The core
presets are defined here; each method module contributes its own through a module-level ``PRESETS`` dict of
``name -> (description, fields)``, so a paper's configurations live beside its code.
"""
from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from torch import nn

from .build import build_model
from .config import ModelConfig, apply_overrides, config_from_dict, flatten_overrides
from .core.config import ConfigError
from .methods import conv_branch, crossformer, lightweight, multipass, predictive


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    fields: dict[str, Any]


_IWSLT = dict(arch="encoder_decoder", src_vocab_size=10000, d_model=512, n_heads=4, d_ffn=1024, enc_layers=6,
              dec_layers=6, dropout=0.3, share_embeddings=True, tie_output=True)
_BASE = dict(arch="encoder_decoder", src_vocab_size=32000, d_model=512, n_heads=8, d_ffn=2048, enc_layers=6,
             dec_layers=6, dropout=0.1, share_embeddings=True, tie_output=True)
_TEXT_CLS = dict(arch="encoder_classifier", src_vocab_size=16000, d_model=256, n_heads=8, d_ffn=1024,
                 enc_layers=3, positions="relative", rel_max_distance=16, max_positions=256, num_classes=5,
                 pooling="mean", dropout=0.2, embed_dropout=0.4)  # PA App. B.2.1 dropouts

# Decoder-only language models (arch="causal_lm"): pre-LN, learned absolute positions, GELU, tied output, unscaled
# N(0, 0.02) token table (GPT-2). nanoGPT's config/train_shakespeare_char.py: 6 layers, 6 heads, d=384, block 256,
# dropout 0.2 on embeddings, attention probabilities and residual branches, no biases (its bias=False also drops the
# LayerNorm biases); 65 characters is tiny-shakespeare's vocabulary, a task sets its own. GPT-2 small (Radford et
# al. 2019, the 124M model): 12 layers, 12 heads, d=768, 1,024 positions, 50,257 BPE tokens, biases, dropout 0.1,
# GELU in its tanh form (the released model's).
_GPT = dict(arch="causal_lm", norm_first=True, positions="learned", activation="gelu", embed_scale=False,
            tie_output=True, embed_dropout=None, act_dropout=0.0)
_GPT_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt_shakespeare_char": ("nanoGPT's shakespeare_char model: decoder-only, 6 layers, 6 heads, d=384, 256 "
                             "positions, dropout 0.2, no biases (10.65M parameters without the position table)",
                             dict(_GPT, src_vocab_size=65, d_model=384, n_heads=6, d_ffn=1536, enc_layers=6,
                                  max_positions=256, dropout=0.2, attn_dropout=0.2, bias=False)),
    "gpt2_small": ("GPT-2 small's shape: decoder-only, 12 layers, 12 heads, d=768, 1,024 positions, 50,257 tokens, "
                   "tanh GELU (124.44M parameters, output tied to the token table)",
                   dict(_GPT, src_vocab_size=50257, d_model=768, n_heads=12, d_ffn=3072, enc_layers=12,
                        max_positions=1024, dropout=0.1, attn_dropout=0.1, bias=True, activation="gelu_tanh")),
}

_CORE_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    **_GPT_PRESETS,
    "transformer_iwslt_de_en": ("fairseq's IWSLT'14 De-En Transformer: 6+6 layers, d=512, 4 heads, FFN 1024, "
                                "shared embeddings", _IWSLT),
    "transformer_base": ("Transformer-Base (Vaswani et al. 2017, Table 3): 6+6 layers, d=512, 8 heads, FFN 2048",
                         _BASE),
    "transformer_small": ("benchmark encoder-decoder: 3+3 layers, d=256, 4 heads, FFN 1024, 8k vocabulary",
                          dict(arch="encoder_decoder", src_vocab_size=8000, d_model=256, n_heads=4, d_ffn=1024,
                               enc_layers=3, dec_layers=3, dropout=0.1, share_embeddings=True)),
    "transformer_multi30k": ("Multi30k De-En translation baseline: 3+3 layers, d=256, 4 heads, FFN 1024, "
                             "dropout 0.3, joint vocabulary with shared embeddings",
                             dict(arch="encoder_decoder", src_vocab_size=8000, d_model=256, n_heads=4, d_ffn=1024,
                                  enc_layers=3, dec_layers=3, dropout=0.3, share_embeddings=True,
                                  max_positions=256)),
    "transformer_text_cls": ("PA paper's text classifier (Sec. 4.1.1, App. B.2.1): M=3 blocks, d=256, 8 heads, "
                             "FFN 1024, relative positions, dropout 0.4 on embeddings and 0.2 elsewhere", _TEXT_CLS),
}


def _collect() -> dict[str, Preset]:
    presets: dict[str, Preset] = {}
    sources = [_CORE_PRESETS] + [getattr(m, "PRESETS", {}) for m in
                                 (crossformer, multipass, predictive, conv_branch, lightweight)]
    for source in sources:
        for name, (description, fields) in source.items():
            if name in presets:
                raise RuntimeError(f"preset {name!r} is defined twice")
            presets[name] = Preset(name, description, fields)
    return presets


PRESETS: dict[str, Preset] = _collect()


def list_presets() -> list[str]:
    return sorted(PRESETS)


def get_config(name_or_config: Union[str, Path, ModelConfig, dict], **overrides: Any) -> ModelConfig:
    """A validated config from a preset name, a config file, a dict or a config, with overrides applied.

    Overrides use field names; a method section's keys are reached with a double underscore or a dict:
    ``get_config("transformer_small", d_model=128, crossformer={"hard": ["kq"]})``.
    """
    if isinstance(name_or_config, ModelConfig):
        cfg = copy.deepcopy(name_or_config)
    elif isinstance(name_or_config, dict):
        cfg = config_from_dict(copy.deepcopy(name_or_config))
    elif isinstance(name_or_config, str) and name_or_config in PRESETS:
        cfg = config_from_dict(copy.deepcopy(PRESETS[name_or_config].fields), source=f"preset {name_or_config}")
    elif Path(name_or_config).suffix in (".json", ".yaml", ".yml"):
        cfg = ModelConfig.load(name_or_config)
    else:
        close = difflib.get_close_matches(str(name_or_config), list(PRESETS), n=3)
        raise ConfigError(f"unknown preset {name_or_config!r}" + (f"; did you mean {close}?" if close else "")
                          + " (list them with `interlayer models`, or pass a .json/.yaml config file)")
    if not overrides:
        return cfg
    return apply_overrides(cfg, flatten_overrides(overrides))


def create_model(name_or_config: Union[str, Path, ModelConfig, dict], **overrides: Any) -> nn.Module:
    """Build a model from a preset name, config file, dict or config; ``overrides`` as in :func:`get_config`."""
    return build_model(get_config(name_or_config, **overrides))
