"""The README tells the truth: every speed figure it quotes is one docs/benchmarks.md holds with the same value, and
what it says of the command line (the model families `interlayer models` lists) is what the code does."""
from __future__ import annotations

import re
from pathlib import Path

from interlayer.models import registry

ROOT = Path(__file__).resolve().parents[1]
# A ratio ("1.86x", "0.95×", not a name such as "LW-1x" or "Transformer3x") or a throughput ("1,782 target tokens/s").
RATIO = re.compile(r"(?<![\w.,-])(\d[\d,]*(?:\.\d+)?)[×x](?![\w])")
THROUGHPUT = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s+(?:target\s+|new\s+)?(?:tokens|characters)/s")
SPEED_WORDS = re.compile(r"\d[^.]*\b(?:times faster|times slower|s per iteration|the throughput)\b")


def _normalise(text: str) -> str:
    return text.replace("×", "x").replace("**", "")


def figures(text: str) -> list[str]:
    """The ratios and throughputs quoted in ``text``, normalised (``×`` -> ``x``)."""
    text = _normalise(text)
    return [m.group(1) + "x" for m in RATIO.finditer(text)] + [m.group(1) for m in THROUGHPUT.finditer(text)]


def test_every_speed_figure_in_the_readme_is_held_by_the_benchmarks_doc() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bench = _normalise((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8"))
    quoted = figures(readme)
    assert "1.86x" in quoted  # the pattern finds the README's figures at all
    missing = [f for f in quoted if not re.search(rf"(?<![\d.,]){re.escape(f)}(?![\d])", bench)]
    assert not missing, f"README quotes {missing}, which docs/benchmarks.md does not hold"
    loose = SPEED_WORDS.findall(_normalise(readme))
    assert not loose, f"README states speed in words docs/benchmarks.md cannot hold as a figure: {loose}"


def test_the_figure_pattern_catches_a_figure_the_benchmarks_doc_lacks() -> None:
    assert figures("runs at 1.23x the baseline, 1,234 target tokens/s; LW-1x and Transformer3x are names") == [
        "1.23x", "1,234"]


def test_the_readme_names_every_family_interlayer_models_lists() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    families = {preset.family for preset in registry.presets().values()}
    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
             "ten": 10}
    claim = re.search(r"`interlayer models` lists all (\w+) families", readme)
    assert claim is not None and words[claim.group(1)] == len(families)
