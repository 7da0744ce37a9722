"""Tiny synthetic German-English corpora: word-for-word translations over a 12-word lexicon."""
from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import Mapping

LEXICON = {"ein": "a", "hund": "dog", "katze": "cat", "läuft": "runs", "schnell": "fast", "rote": "red",
           "blaue": "blue", "mann": "man", "frau": "woman", "sieht": "sees", "große": "big", "kleine": "small"}
# The first ten words: the corpus the comparison and reliability tests train on.
SHORT_LEXICON = dict(list(LEXICON.items())[:10])


def sentence_pairs(n: int, seed: int, lexicon: Mapping[str, str] = LEXICON, lengths: tuple[int, int] = (3, 6),
                   sentences: bool = True) -> list[tuple[str, str]]:
    """``n`` (German, English) pairs of ``lengths`` words; ``sentences``: capitalised and ending with a full stop."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = rng.choices(list(lexicon), k=rng.randint(*lengths))
        de, en = " ".join(words), " ".join(lexicon[w] for w in words)
        pairs.append((de.capitalize() + ".", en.capitalize() + ".") if sentences else (de, en))
    return pairs


def write_corpus(root: Path, sizes: Mapping[str, tuple[int, int]], *, gzip_target: bool = False,
                 lexicon: Mapping[str, str] = LEXICON, lengths: tuple[int, int] = (3, 6),
                 sentences: bool = True) -> Path:
    """``root/{split}.de`` and ``root/{split}.en`` (``.en.gz`` with ``gzip_target``) for each split in ``sizes``
    (split -> (lines, seed)); returns ``root``."""
    for split, (n, seed) in sizes.items():
        pairs = sentence_pairs(n, seed, lexicon, lengths, sentences)
        (root / f"{split}.de").write_text("\n".join(p[0] for p in pairs) + "\n")
        target = "\n".join(p[1] for p in pairs) + "\n"
        if gzip_target:
            with gzip.open(root / f"{split}.en.gz", "wt", encoding="utf-8") as handle:
                handle.write(target)
        else:
            (root / f"{split}.en").write_text(target)
    return root
