"""Mean ± sample standard deviation of a result over seeds, for run folders named ``<variant>-s<seed>``.

    python benchmarks/summarize_runs.py runs/graph test_accuracy
    python benchmarks/summarize_runs.py runs/translation test_bleu
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

from interlayer.tables import format_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="folder holding <variant>-s<seed> run folders")
    parser.add_argument("key", help="key of results.json to summarise (e.g. test_accuracy, test_bleu)")
    args = parser.parse_args()
    values: dict[str, list[float]] = defaultdict(list)
    extra: dict[str, dict] = {}
    for results in sorted(args.root.glob("*/results.json")):
        match = re.fullmatch(r"(.+)-s(\d+)", results.parent.name)
        data = json.loads(results.read_text())
        if match and data.get("status") == "finished" and data.get(args.key) is not None:
            values[match.group(1)].append(float(data[args.key]))
            extra[match.group(1)] = data
    rows = []
    for variant, vals in values.items():
        spread = statistics.stdev(vals) if len(vals) > 1 else float("nan")
        rows.append([variant, len(vals), f"{statistics.mean(vals):.2f} ± {spread:.2f}",
                     " ".join(f"{v:.1f}" for v in vals), extra[variant].get("parameters", ""),
                     extra[variant].get("madds", extra[variant].get("madds_at_64", ""))])
    print(format_table(["variant", "seeds", f"{args.key} mean ± std", "per seed", "parameters", "MAdds"], rows))


if __name__ == "__main__":
    main()
