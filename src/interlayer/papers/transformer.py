"""The plain Transformers the papers build on and compare against: Transformer-Base (Vaswani et al. 2017), fairseq's
IWSLT'14 model, PA's text classifier, GPT-2 small and nanoGPT's character model, and the small shapes this project
trains on a CPU. The papers' own presets (:mod:`interlayer.papers.crossformer`, ...) start from these fields.
"""
from __future__ import annotations

from typing import Any

from ..models.registry import register_presets

# fairseq's transformer_iwslt_de_en, Transformer-Base (Vaswani et al. 2017, Table 3), the benchmark encoder-decoder
# and PA's text classifier (Sec. 4.1.1, App. B.2.1): the fields the papers' presets start from.
IWSLT: dict[str, Any] = dict(arch="encoder_decoder", src_vocab_size=10000, d_model=512, n_heads=4, d_ffn=1024,
                             enc_layers=6, dec_layers=6, dropout=0.3, share_embeddings=True, tie_output=True)
SMALL: dict[str, Any] = dict(arch="encoder_decoder", src_vocab_size=8000, d_model=256, n_heads=4, d_ffn=1024,
                             enc_layers=3, dec_layers=3, dropout=0.1, share_embeddings=True)
BASE: dict[str, Any] = dict(arch="encoder_decoder", src_vocab_size=32000, d_model=512, n_heads=8, d_ffn=2048,
                            enc_layers=6, dec_layers=6, dropout=0.1, share_embeddings=True, tie_output=True)
TEXT_CLS: dict[str, Any] = dict(arch="encoder_classifier", src_vocab_size=16000, d_model=256, n_heads=8, d_ffn=1024,
                                enc_layers=3, positions="relative", rel_max_distance=16, max_positions=256,
                                num_classes=5, pooling="mean", dropout=0.2, embed_dropout=0.4)  # PA App. B.2.1 dropouts

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

PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    **_GPT_PRESETS,
    "transformer_iwslt_de_en": ("fairseq's IWSLT'14 De-En Transformer: 6+6 layers, d=512, 4 heads, FFN 1024, "
                                "shared embeddings", IWSLT),
    "transformer_base": ("Transformer-Base (Vaswani et al. 2017, Table 3): 6+6 layers, d=512, 8 heads, FFN 2048",
                         BASE),
    "transformer_small": ("benchmark encoder-decoder: 3+3 layers, d=256, 4 heads, FFN 1024, 8k vocabulary", SMALL),
    "transformer_multi30k": ("Multi30k De-En translation baseline: 3+3 layers, d=256, 4 heads, FFN 1024, "
                             "dropout 0.3, joint vocabulary with shared embeddings",
                             dict(arch="encoder_decoder", src_vocab_size=8000, d_model=256, n_heads=4, d_ffn=1024,
                                  enc_layers=3, dec_layers=3, dropout=0.3, share_embeddings=True,
                                  max_positions=256)),
    "transformer_text_cls": ("PA paper's text classifier (Sec. 4.1.1, App. B.2.1): M=3 blocks, d=256, 8 heads, "
                             "FFN 1024, relative positions, dropout 0.4 on embeddings and 0.2 elsewhere", TEXT_CLS),
}

register_presets("transformer", PRESETS)
