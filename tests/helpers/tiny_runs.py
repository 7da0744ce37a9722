"""Settings of the smallest runs each task trains in a second or two, for the tests that drive ``interlayer train``
and ``compare`` end to end through ``cli.main``."""
from __future__ import annotations

from pathlib import Path

from helpers import set_args

TINY_TRANSLATION = ["d_model=32", "n_heads=2", "d_ffn=64", "enc_layers=1", "dec_layers=1", "train.max_tokens=256",
                    "train.warmup_steps=2", "data.vocab_size=60"]
TINY_TEXT = ["d_model=16", "n_heads=2", "d_ffn=32", "enc_layers=1"]
TINY_VQA = ["d_model=16", "n_heads=2", "d_ffn=32", "layers=1", "word_dim=8", "flat_mlp=16", "fused_dim=16",
            "feature_dim=4", "data.train_size=32", "data.valid_size=8", "data.test_size=8", "data.batch_size=16",
            "data.pavpu_samples=3"]
TINY_IMAGE = ["d_model=16", "n_heads=2", "d_ffn=32", "enc_layers=1", "data.batch_size=8"]
TINY_LM = ["d_model=16", "n_heads=2", "d_ffn=32", "enc_layers=1", "data.block_size=16", "train.max_tokens=64"]


def translation_args(corpus: Path, run: Path, *sets: str) -> list[str]:
    """``interlayer train translation`` on the test corpus (``conftest.corpus``) into ``run``, greedy, tiny."""
    files = [arg for split in ("train", "valid", "test") for side, lang in (("src", "de"), ("tgt", "en"))
             for arg in (f"--{split}-{side}", str(corpus / f"{split}.{lang}"))]
    return ["train", "translation", "--run-dir", str(run), "--no-progress", "--beam", "1", *files,
            *set_args([*TINY_TRANSLATION, *sets])]
