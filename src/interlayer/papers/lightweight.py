"""LW-Transformer (Luo et al.), Tables II and III: the rows as MCAN presets, and the tables beside our builds; the
captioning (Table VIII) and REC (Tables II, VII) rows as region-model presets.

Every headline row of the paper is MCAN on VQA (Sec. IV-A), so each row here is an MCAN preset
(:mod:`interlayer.models.mcan`) whose ``lightweight`` section is the row's configuration; ``interlayer tables``
prints the comparison. The captioning and REC baselines are the same 6 + 6 blocks over region features
(:mod:`interlayer.models.regions`), so LW1x and LW3x there are the same sections on ``caption_transformer`` and
``rec_transformer``. Table IX's image rows are Swin presets (:mod:`interlayer.models.swin`): Swin-T's size at 224
x 224, whose parameters and MAdds ``interlayer tables`` prints beside the paper's, and the CPU-scale Swin for 28 x 28
images; the earlier ViT stand-ins stay as ViT presets (:mod:`interlayer.models.vision`). The method itself is
:mod:`interlayer.methods.lightweight`.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..accounting import count_parameters
from ..models.mcan import MODEL_TYPE
from ..models.regions import REGION_PRESETS
from ..models.registry import create_model, register_presets
from ..models.swin import MODEL_TYPE as SWIN
from ..models.swin import SWIN_FASHION_MNIST, SWIN_T
from ..models.vision import VIT, with_encoder
from ..tables import human

# ----------------------------------------------------------------------------------------------------------------
# The paper's Tables II and III. The baseline is MCAN's encoder-decoder (Sec. IV-A: d=512, d_f=2048, d_h=64, h=8,
# 6+6 layers, post-LN): interlayer.models.mcan builds it, and each row below is an MCAN preset there (the row's
# ``lightweight`` section over MCAN-small). The paper counts only the Transformer layers (Table II footnote 3: the
# language and vision encoders are not counted; its 44.1M leaves out AttFlat and the classifier too).
# MCAN's VQA inputs: questions of 14 tokens (encoder), 100 image regions (decoder); with them the baseline's
# MAdds are 2,581,536,768, Table II's 2.58G.
_QUESTION_TOKENS, _REGIONS = 14, 100

_NO_WS = dict(share_weights=False)
Row = tuple[str, str, Optional[dict[str, Any]], float, float]
# (MCAN preset, paper's row, lightweight section or None for the baseline, paper #params in M, paper MAdds in G)
_TABLE_II: list[Row] = [
    ("mcan_small", "Transformer", None, 44.1, 2.58),
    ("lw_mcan_1x_gmha", "LW-Transformer1x G-MHA, k=2", dict(ffn=False, **_NO_WS), 37.0, 2.21),
    ("lw_mcan_1x_gffn", "LW-Transformer1x G-FFN, k=2", dict(attention=False, **_NO_WS), 37.7, 2.22),
    ("lw_mcan_1x_gmha_gffn", "LW-Transformer1x G-MHA+G-FFN, k=2", dict(_NO_WS), 32.4, 1.85),
    ("lw_mcan_1x", "LW-Transformer1x (dagger) G-MHA+G-FFN+WS, k=2", {}, 24.0, 1.85),
    ("lw_mcan_2x", "LW-Transformer2x G-MHA+G-FFN+WS, k=2", dict(qk_expansion=2), 26.3, 2.16),
    ("lw_mcan_3x", "LW-Transformer3x (dagger) G-MHA+G-FFN+WS, k=2", dict(qk_expansion=3), 28.7, 2.46),
    ("lw_mcan_3x_k4", "LW-Transformer3x G-MHA+G-FFN+WS, k=4", dict(qk_expansion=3, groups=4), 21.9, 1.83),
    ("lw_mcan_3x_k8", "LW-Transformer3x G-MHA+G-FFN+WS, k=8", dict(qk_expansion=3, groups=8), 19.8, 1.51),
]
_TABLE_III: list[Row] = [
    ("lw_mcan_1x_glml", "LW-Transformer1x + G-LML", dict(group_merge=True), 20.4, 1.69),
    ("lw_mcan_mini", "LW-Transformer-mini1x (+ G-IL)", dict(group_intermediate=True), 14.5, 1.50),
    ("lw_mcan_1x_glml_gil", "LW-Transformer1x + G-LML + G-IL", dict(group_merge=True, group_intermediate=True),
     11.0, 1.33),
]
LW_TABLE_ROWS: list[Row] = _TABLE_II + _TABLE_III


def layer_counts(preset: str) -> tuple[int, int, int]:
    """(parameters of the SA and SGA blocks, of the whole MCAN, MAdds of the blocks at 14 tokens + 100 regions)
    of an MCAN preset; built on the meta device, so no memory is allocated."""
    with torch.device("meta"):
        model = create_model(preset, family=MODEL_TYPE)
    layers = nn.ModuleList([*model.encoder.layers, *model.decoder.layers])
    madds = model.encoder.madds(_QUESTION_TOKENS) + model.decoder.madds(_REGIONS, _QUESTION_TOKENS)
    return count_parameters(layers), count_parameters(model), madds


def _diff(ours: int, paper: float, scale: float, unit: str) -> str:
    delta = ours - paper * scale
    return f"{delta / scale:+.3f}{unit} ({100 * delta / (paper * scale):+.1f}%)"


def _table_rows(rows: list[Row]) -> list[list]:
    out = []
    for name, row, _, paper_params, paper_madds in rows:
        params, whole, madds = layer_counts(name)
        out.append([f"{row} [{name}]", f"{params:,}", human(params), f"{paper_params}M",
                    _diff(params, paper_params, 1e6, "M"), human(whole), f"{madds / 1e9:.3f}G", f"{paper_madds}G",
                    _diff(madds, paper_madds, 1e9, "G")])
    return out


_HEADERS = ["configuration [MCAN preset]", "block params (ours)", "ours", "paper", "diff",
            "whole MCAN (20k words, 3,129 answers)", "block MAdds (ours, 14+100 tokens)", "paper", "diff"]


# Table IX: LW-Transformer on Swin-T (ImageNet-1K, 224 x 224): G-MHA + G-FFN in every block, no weight sharing
# (Sec. IV-A). Swin-T's first stage has 3 heads, which k = 2 and 4 do not divide: heads straddle the groups
# (lightweight.straddle_heads; docs/vision-backbones.md). LW-Transformer-large has "16 Transformer blocks" (Sec.
# IV-A) without saying where: the four more go to stage 3, where Swin itself deepens (Swin-S: 2-2-18-2).
_LW_SWIN = dict(groups=2, share_weights=False, straddle_heads=True)
_LARGE_DEPTHS = [2, 2, 10, 2]
# (preset, paper's row, Swin fields over Swin-T, paper params in M, MAdds in G)
_TABLE_IX: list[tuple[str, str, dict[str, Any], float, float]] = [
    ("swin_t", "Swin-Transformer (Swin-T)", {}, 28.3, 4.5),
    ("lw_swin_t", "LW-Transformer1x, k=2", dict(lightweight=_LW_SWIN), 20.0, 3.3),
    ("lw_large_swin_t", "LW-Transformer-large1x, k=2 (16 blocks)", dict(depths=_LARGE_DEPTHS, lightweight=_LW_SWIN),
     27.0, 4.5),
    ("lw_swin_t_k4", "LW-Transformer1x, k=4", dict(lightweight=dict(_LW_SWIN, groups=4)), 16.9, 2.6),
]


def _table_ix_rows() -> list[list]:
    rows = []
    for name, row, _, paper_params, paper_madds in _TABLE_IX:
        with torch.device("meta"):
            model = create_model(name, family=SWIN)
        params, madds = count_parameters(model), model.madds()
        rows.append([f"{row} [{name}]", f"{params:,}", human(params), f"{paper_params}M",
                     _diff(params, paper_params, 1e6, "M"), f"{madds / 1e9:.3f}G", f"{paper_madds}G",
                     _diff(madds, paper_madds, 1e9, "G")])
    return rows


def paper_tables() -> list[tuple[str, list[str], list[list]]]:
    """Tables II and III of the paper beside our MCAN presets.

    Parameters count the SA and SGA blocks only, as the paper does (footnote 3); the whole-model column adds the
    word embedding (a 20k placeholder vocabulary of 300-d vectors), the LSTM, the image projection, AttFlat and the
    3,129-answer classifier. MAdds are those of the blocks for a 14-token question (encoder) and 100 image regions
    (decoder), MCAN's VQA setting, with which the baseline gives Table II's 2.58G.

    Nine parameter rows agree within +0.04M..+0.15M. Three cannot be reproduced by any consistent reading while
    their MAdds match: G-MHA+G-FFN without WS (paper 32.4M; ours 30.77M = the baseline minus the two disjoint
    savings of the rows above it) and 3x at k=4 / k=8 (paper 21.9M / 19.8M; ours 20.23M / 18.09M, and no choice
    of shared layers yields both figures, while the paper's k=4 -> 8 step, 2.1M, matches ours, 2.15M).

    Table IX (Swin-T; parameters and MAdds of the whole network, as the paper counts them): Swin-T, and k=2's MAdds
    and k=4's parameters, agree within 1%; k=2's parameters (+0.74M) and k=4's MAdds (+0.07G) do not, and no
    reading gives both rows (grouping the patch mergings too would give k=2's 20.0M but k=4 15.8M); LW-large's 16
    blocks are placed by no stated rule, and stage 3 (ours, 25.8M / 4.29G) falls short of 27.0M / 4.5G
    (docs/vision-backbones.md).
    """
    return [
        ("LW-Transformer Table II (ablation: G-MHA, G-FFN, WS, n x, k) on MCAN", list(_HEADERS),
         _table_rows(_TABLE_II)),
        ("LW-Transformer Table III (G-LML, G-IL; mini = G-IL) on MCAN", list(_HEADERS), _table_rows(_TABLE_III)),
        *region_tables(),
        ("LW-Transformer Table IX (image classification) on Swin-T, 224x224, 1,000 classes",
         ["configuration [Swin preset]", "params (ours)", "ours", "paper", "diff", "MAdds (ours)", "paper", "diff"],
         _table_ix_rows()),
    ]


# ----------------------------------------------------------------------------------------------------------------
# Captioning and REC (Sec. IV-A: "For VQA, IC and REC, we use the Transformer networks proposed in [1], [2]"): the
# same 6 + 6 blocks over region features. Table VIII gives the captioners' parameters (44M, 24M, 29M); Table VII has
# none, and Table II's column (44.1M, 24.0M, 28.7M) is the one its RefCOCO results come with. Our MAdds are those
# of the blocks at 100 regions and 20 words (the paper gives MAdds for VQA's inputs only).
_REGION_ROWS: dict[str, list[tuple[str, str, Optional[dict[str, Any]], float]]] = {
    "caption": [("caption_transformer", "Transformer", None, 44.0),
                ("lw_caption_1x", "LW-Transformer1x", {}, 24.0),
                ("lw_caption_3x", "LW-Transformer3x", dict(qk_expansion=3), 29.0)],
    "rec": [("rec_transformer", "Transformer", None, 44.1),
            ("lw_rec_1x", "LW-Transformer1x", {}, 24.0),
            ("lw_rec_3x", "LW-Transformer3x", dict(qk_expansion=3), 28.7)],
}
_REGIONS, _WORDS = 100, 20


def region_tables() -> list[tuple[str, list[str], list[list]]]:
    """LW's captioning (Table VIII) and REC (Table II's parameters of the RefCOCO rows) models beside our
    region-model presets: block parameters as the paper counts them, the whole model, our block MAdds."""
    titles = {"caption": "LW-Transformer Table VIII (COCO captioning) beside our captioners",
              "rec": "LW-Transformer Tables II / VII (RefCOCO) beside our REC models"}
    out = []
    for head, rows in _REGION_ROWS.items():
        table = []
        for name, row, _, paper in rows:
            with torch.device("meta"):
                model = create_model(name)
            blocks = count_parameters(nn.ModuleList([*model.encoder.layers, *model.decoder.layers]))
            words, regions = (_WORDS, _REGIONS) if head == "rec" else (_REGIONS, _WORDS)
            madds = model.encoder.madds(words) + model.decoder.madds(regions, words) if head == "rec" else \
                model.encoder.madds(regions) + model.decoder.madds(words, regions)
            table.append([f"{row} [{name}]", f"{blocks:,}", human(blocks), f"{paper}M", _diff(blocks, paper, 1e6, "M"),
                          human(count_parameters(model)), f"{madds / 1e9:.3f}G"])
        out.append((titles[head], ["configuration [preset]", "block params (ours)", "ours", "paper", "diff",
                                   "whole model (10k words)", f"block MAdds (ours, {_REGIONS} regions + {_WORDS} "
                                   "words)"], table))
    return out


def _with_lightweight(base: str, section: dict[str, Any]) -> dict[str, Any]:
    fields = REGION_PRESETS[base][1]
    return dict(fields, transformer=dict(fields["transformer"], lightweight=dict(section)))


register_presets("region", {
    name: (f"{row} on LW Sec. IV-A's {head} baseline (k=2; LW Table {'VIII' if head == 'caption' else 'II'}: "
           f"{paper}M)", _with_lightweight(rows[0][0], section))
    for head, rows in _REGION_ROWS.items() for name, row, section, paper in rows if section is not None})


register_presets(MODEL_TYPE, {
    name: (f"{row} on MCAN-small (LW Table II/III: {params}M in the blocks, {madds}G MAdds)",
           dict(lightweight=dict(section)))
    for name, row, section, params, madds in LW_TABLE_ROWS if section is not None})

_LW_IMAGE = dict(groups=2, share_weights=False)  # Sec. IV-A: "we remove weight-sharing" for Swin
register_presets("image", {
    "lw_vit_fashion_mnist": (
        "LW-Transformer1x on the ViT (LW Table IX row k=2): G-MHA + G-FFN, 2 groups, no weight sharing",
        with_encoder(VIT, lightweight=_LW_IMAGE)),
    "lw_vit_k4_fashion_mnist": (
        "LW-Transformer1x on the ViT (LW Table IX row k=4): G-MHA + G-FFN, 4 groups, no weight sharing",
        with_encoder(VIT, lightweight=dict(_LW_IMAGE, groups=4))),
    "lw_large_vit_fashion_mnist": (
        "LW-Transformer-large1x (LW Table IX): k=2, 6 layers instead of 4 for about the ViT's parameters",
        with_encoder(VIT, enc_layers=6, lightweight=_LW_IMAGE)),
})

register_presets(SWIN, {name: (f"{row} on Swin-T (LW Table IX: {params}M, {madds}G MAdds; no weight sharing)",
                               dict(SWIN_T, **fields))
                        for name, row, fields, params, madds in _TABLE_IX if fields})
# The same rows on the CPU-scale Swin (28 x 28 grey images): LW-large's two more blocks go to the middle stage (the
# analogue of Swin-T's stage 3), 6 -> 8 blocks as 12 -> 16.
register_presets(SWIN, {
    "lw_swin_fashion_mnist": (
        "LW-Transformer1x on the CPU Swin (LW Table IX row k=2): G-MHA + G-FFN, 2 groups, no weight sharing",
        dict(SWIN_FASHION_MNIST, lightweight=dict(_LW_IMAGE))),
    "lw_swin_k4_fashion_mnist": (
        "LW-Transformer1x on the CPU Swin (LW Table IX row k=4): 4 groups over 2-4-8 heads (heads straddle groups)",
        dict(SWIN_FASHION_MNIST, lightweight=dict(_LW_SWIN, groups=4))),
    "lw_large_swin_fashion_mnist": (
        "LW-Transformer-large1x on the CPU Swin (LW Table IX): k=2, depths 2-4-2 (8 blocks instead of 6)",
        dict(SWIN_FASHION_MNIST, depths=[2, 4, 2], lightweight=dict(_LW_IMAGE))),
})
