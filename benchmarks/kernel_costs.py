"""What each kernel case costs a layer at GPT-2 small (batch 8 x 1,024), from the offline machine-code audits, for
bench_gpu.py's additive estimate (``benchmarks/kernel_costs.json``).

An audit at GPT-2 small itself shadows every program of a 1,024-long map and takes long on a CPU; the audits at one
sequence of 512 and of 256 (``bench_kernels.py --resources --sizes audit`` / ``audit-half``) fix it instead. A map
case's bytes and instructions are ``a T^2 + b T`` (its cells, and rows of halo and diagonal blocks; nothing else
grows), so the two lengths give its value at 1,024, times 8 sequences; a per-position case (the hyper-connections,
the cross-entropy) scales with the positions. ``tests/test_bench_kernels.py`` checks the same extrapolation of the
bytes against the issue's bars.

    TRITON_DEFAULT_FP_FUSION=1 python benchmarks/kernel_costs.py             # runs both audits (minutes)
    python benchmarks/kernel_costs.py --audit A.json --half H.json          # from audits already written
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MAPS = ("logits-attention", "pa-maps", "res-maps")  # cases over a T x T map
FIELDS = ("instructions", "mma", "barriers", "bytes_loaded", "bytes_stored", "torch_bytes", "bytes")
GPT2 = {"B": 8, "T": 1024}


def audit(sizes: str, cases: list[str]) -> dict[str, Any]:
    """``bench_kernels.py --resources --sizes SIZES`` for ``cases``, in a process without the interpreter."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "audit.json"
        env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
        subprocess.run([sys.executable, str(HERE / "bench_kernels.py"), "--resources", "--sizes", sizes,
                        *(["--cases", *cases] if cases else []), "--json", str(out)], env=env, check=True)
        return json.loads(out.read_text())["audit"]


def at_gpt2(half: dict[str, Any] | None, whole: dict[str, Any]) -> dict[str, float]:
    """One case's totals at GPT-2 small: quadratic in T from two lengths (a map case), else per position."""
    t2, b2 = whole["sizes"]["T"], whole["sizes"]["B"]
    if half is None:
        scale = GPT2["B"] * GPT2["T"] / (b2 * t2)
        return {f: whole["totals"][f] * scale for f in FIELDS}
    t1, b1 = half["sizes"]["T"], half["sizes"]["B"]
    out = {}
    for f in FIELDS:
        y1, y2 = half["totals"][f] / b1 / t1, whole["totals"][f] / b2 / t2  # a T + b
        a = (y2 - y1) / (t2 - t1)
        out[f] = GPT2["B"] * GPT2["T"] * (a * GPT2["T"] + (y2 - a * t2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--audit", type=Path, help="bench_kernels.py --resources --sizes audit's JSON (else run)")
    parser.add_argument("--half", type=Path, help="the same at --sizes audit-half, for the map cases (else run)")
    parser.add_argument("--json", type=Path, default=HERE / "kernel_costs.json")
    args = parser.parse_args()
    whole = json.loads(args.audit.read_text())["audit"] if args.audit else audit("audit", [])
    half = json.loads(args.half.read_text())["audit"] if args.half else audit("audit-half", list(MAPS))
    cases = {name: {"totals": at_gpt2(half.get(name) if name in MAPS else None, case), "sizes": GPT2,
                    "from": "audit at T=256 and 512" if name in MAPS else "audit at T=512, per position"}
             for name, case in whole.items() if name not in MAPS or name in half}
    args.json.write_text(json.dumps({"audit": cases}, indent=1) + "\n")
    for name, case in cases.items():
        print(f"{name:18s} {case['totals']['bytes'] / 1e9:6.2f} GB  {case['totals']['instructions'] / 1e6:8.1f}M "
              "warp-instructions a layer at GPT-2 small")


if __name__ == "__main__":
    main()
