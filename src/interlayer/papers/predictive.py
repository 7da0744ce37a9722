"""Predictive Attention Transformer's presets: PA Table 1's text classifiers and IWSLT'14 model, Table 5's
Res-Transformer, and the Conv-Transformer of Sec. 3.5 (:mod:`interlayer.methods.predictive`,
:mod:`interlayer.methods.conv_branch`). The text classifiers start from the core ``transformer_text_cls``
(:data:`interlayer.papers.transformer.TEXT_CLS`: M=3 blocks, d=256, 8 heads, FFN 1024, Shaw et al. relative
positions, Sec. 4.1.1 and App. B.2.1). PA's image models (Sec. 4.2.1, Table 3) are image-family presets
(:mod:`interlayer.models.vision`) at Fashion-MNIST scale, and PA on MCAN a VQA one (:mod:`interlayer.models.mcan`).
"""
from __future__ import annotations

from typing import Any

from ..models.mcan import MODEL_TYPE as MCAN
from ..models.registry import register_presets
from ..models.vision import VIT, with_encoder
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

# Sec. 4.2.1 at Fashion-MNIST scale: CNN stages of 16 and 32 channels at 28 x 28 and 14 x 14 (the paper's widths
# double per stage from 64 at 32 x 32), then 3 blocks at 7 x 7 and d=64 with 2-D relative positions (Eq. 3), FFN 4x
# (Eq. 6), global average pooling, dropout 0.1 (App. B.3.1 uses 0.2 over 630 epochs; 12 epochs need less). One CNN
# block per stage instead of the paper's three keeps an epoch of 54k images near 3 CPU-minutes.
_CONV_ENCODER: dict[str, Any] = dict(arch="encoder_classifier", src_vocab_size=1, num_classes=10, d_model=64,
                                     n_heads=4, d_ffn=256, enc_layers=3, positions="relative_2d", pooling="mean",
                                     dropout=0.1)
_CONV: dict[str, Any] = dict(backbone="conv_transformer", stage_widths=[16, 32], stage_blocks=1)
_PA_IMAGE = dict(alpha=0.01, conv_layers=1)  # Sec. 4.2.1: "We set alpha = 0.01 empirically" (CIFAR)

IMAGE_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "pa_vit_fashion_mnist": (
        "the ViT with predictive attention (PA Eq. 4) in layers 2-4, alpha=0.01 (PA Sec. 4.2.1's image value)",
        with_encoder(VIT, predictive=_PA_IMAGE)),
    "cnn_fashion_mnist": (
        "PA Table 3's CNN: the Conv-Transformer with 3x3 convolution blocks in place of attention everywhere",
        dict(_CONV, attention=False, encoder=dict(_CONV_ENCODER))),
    "conv_transformer_fashion_mnist": (
        "PA Table 3's Conv-Transformer: CNN stages 16/32 channels, then 3 blocks of half 4-head attention, half "
        "3x3 conv at 7x7, d=64, 2-D relative positions",
        dict(_CONV, encoder=dict(_CONV_ENCODER, conv_branch={}))),
    "pa_conv_transformer_fashion_mnist": (
        "PA Table 3's PA-Conv-Transformer: the Conv-Transformer plus attention prediction, alpha=0.01",
        dict(_CONV, encoder=dict(_CONV_ENCODER, conv_branch={}, predictive=_PA_IMAGE))),
}
MCAN_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "pa_mcan": ("MCAN-small with predictive attention (PA Eq. 4, alpha=0.1, one 3x3 conv) in question SA blocks "
                "2-6", dict(predictive=dict(_PA))),
}

register_presets("transformer", PRESETS)
register_presets("image", IMAGE_PRESETS)
register_presets(MCAN, MCAN_PRESETS)
