"""Every method in ``METHODS`` is documented where a user looks: its page in docs/methods/ (its own, or a
``## `NAME` `` section of its paper's page), its paragraph in the README (``NAME={...}`` and a link to that page),
and a row for each of its named variants in docs/compare.md's variant table; and no page there is left from a
method that is gone. A new method fails here until it has all three."""
from __future__ import annotations

import re
from pathlib import Path

from interlayer.methods import METHODS

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "methods"


def method_page(name: str) -> Path | None:
    """The method's page: ``docs/methods/NAME.md``, else the page with a ``## `NAME` `` section."""
    own = PAGES / f"{name}.md"
    if own.is_file():
        return own
    heading = re.compile(rf"^## `{re.escape(name)}`", re.MULTILINE)
    return next((p for p in sorted(PAGES.glob("*.md")) if heading.search(p.read_text(encoding="utf-8"))), None)


def variant_rows(compare_md: str) -> set[str]:
    """The variant names in the first column of docs/compare.md's ``| named variant |`` table."""
    table = compare_md.split("| named variant |", 1)[1].split("\n\n", 1)[0]
    return {name for line in table.splitlines()[2:] for name in re.findall(r"`([a-z0-9_]+)`", line.split("|")[1])}


def undocumented(readme: str, compare_md: str) -> list[str]:
    """What each method lacks, in words (empty: every method is documented)."""
    missing, rows = [], variant_rows(compare_md)
    for method in METHODS:
        page = method_page(method.name)
        if page is None:
            missing.append(f"{method.name}: no docs/methods/{method.name}.md nor a '## `{method.name}`' section")
        elif f"(docs/methods/{page.name})" not in readme:
            missing.append(f"{method.name}: the README links no docs/methods/{page.name}")
        if f"`{method.name}={{" not in readme:
            missing.append(f"{method.name}: no README paragraph showing `{method.name}={{...}}`")
        missing += [f"{method.name}: no docs/compare.md row for variant {v!r}"
                    for v in method.variants if v not in rows]
    return missing


def test_every_method_has_its_page_its_readme_paragraph_and_its_compare_rows() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    compare_md = (ROOT / "docs" / "compare.md").read_text(encoding="utf-8")
    assert undocumented(readme, compare_md) == []
    assert {"lw_1x", "crossformer_kq", "mhc", "conv"} <= variant_rows(compare_md)  # the table is found at all


def test_every_page_in_docs_methods_is_a_methods_page() -> None:
    names = {method.name for method in METHODS}
    assert sorted(p.stem for p in PAGES.glob("*.md") if p.stem not in names) == []


def test_the_check_names_what_a_method_lacks() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    compare_md = (ROOT / "docs" / "compare.md").read_text(encoding="utf-8")
    lacking = undocumented(readme.replace("(docs/methods/mhc.md)", "").replace("`cla={", "`cla ={"),
                           re.sub(r"\| `mhc` \|", "| mhc |", compare_md))
    assert lacking == ["mhc: the README links no docs/methods/mhc.md", "mhc: no docs/compare.md row for variant 'mhc'",
                       "cla: no README paragraph showing `cla={...}`"]
    assert method_page("conv_branch") == PAGES / "predictive.md"  # a section of its paper's page
