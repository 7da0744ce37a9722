"""Predictive Attention Transformer's presets: PA Table 1's text classifiers and IWSLT'14 model, Table 5's
Res-Transformer, and the Conv-Transformer of Sec. 3.5 (:mod:`interlayer.methods.predictive`,
:mod:`interlayer.methods.conv_branch`). The text classifiers start from the core ``transformer_text_cls``
(:data:`interlayer.papers.transformer.TEXT_CLS`: M=3 blocks, d=256, 8 heads, FFN 1024, Shaw et al. relative
positions, Sec. 4.1.1 and App. B.2.1). PA's image models (Table 3) are with the image family
(:mod:`interlayer.models.vision`).
"""
from __future__ import annotations

from typing import Any

from ..models.registry import register_presets
from .transformer import TEXT_CLS

# IWSLT'14 De-En (Sec. 4.1.1, App. B.2.1): 6+6 blocks, hidden size 160 everywhere ("removes the bottleneck", after
# Wu et al. 2020), 10K joint BPE (shared embeddings), dropout 0.2, absolute positions. The head count is not given;
# 4 is fairseq's IWSLT setting.
_IWSLT: dict[str, Any] = dict(arch="encoder_decoder", src_vocab_size=10000, d_model=160, n_heads=4, d_ffn=160,
                              enc_layers=6, dec_layers=6, positions="sinusoidal", dropout=0.2, share_embeddings=True,
                              tie_output=True)
_PA = dict(alpha=0.1, conv_layers=1)

PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "pa_transformer_text": (
        "PA-Transformer text classifier (PA Sec. 4.1.1, Table 1): M=3, d=256, 8 heads, FFN 1024, relative "
        "positions, one 3x3 conv per prediction module, alpha=0.1 (SST/Yelp; 0.5 for SNLI)",
        dict(TEXT_CLS, predictive=dict(_PA))),
    "res_transformer_text": (
        "Res-Transformer (PA Table 5): the text classifier with conv_layers=0, i.e. A = softmax(0.1 A_prev + 0.9 A)",
        dict(TEXT_CLS, predictive=dict(_PA, conv_layers=0))),
    "conv_transformer_text": (
        "Conv-Transformer (PA Sec. 3.5, Table 1, App. B.1): half self-attention (4 heads), half 1-D conv "
        "(kernel 3), M=3, d=256",
        dict(TEXT_CLS, conv_branch={})),
    "pa_conv_transformer_text": (
        "PA-Conv-Transformer (PA Sec. 3.5, Table 1, Fig. 4): Conv-Transformer plus attention prediction over "
        "the 4 attention heads, alpha=0.1",
        dict(TEXT_CLS, conv_branch={}, predictive=dict(_PA))),
    "pa_transformer_iwslt_de_en": (
        "PA-Transformer for IWSLT'14 De-En (PA Sec. 4.1.1, Table 1): 6+6 layers, d=160, FFN 160, PA on the "
        "encoder only, alpha=0.1",
        dict(_IWSLT, predictive=dict(_PA))),
}

register_presets("transformer", PRESETS)
