"""``compare``'s options for compute budgets and the scaling sweep, added to its parser and read back here, so that
the command line holds one call for each: ``--budget-flops``, ``--budget-tokens`` (:mod:`.budget`), ``--sizes``,
``--tokens-per-parameter``, ``--extrapolate`` and ``--scaling-axis`` (:mod:`.scaling`)."""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Optional, Sequence, get_args

from ..errors import ConfigError
from .plan import Settings
from .scaling import FOLLOWERS, Axis, SweepOptions, parse_size, parse_sizes
from .selection import Selection

SWEEP_OUTPUT = "runs/compare/{task}-scaling"


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} must be a positive finite number")
    return value


def _whole(text: str) -> int:
    value = _positive(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text} is not a whole number")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The compute budgets beside ``--budget-steps``, and the scaling sweep's group."""
    parser.add_argument("--budget-flops", type=_positive, metavar="F",
                        help="training FLOPs per run (6 x multiply-adds per token, attention included; 1e13 is "
                             "accepted): each variant trains the whole steps F buys at its own cost per step (lm)")
    parser.add_argument("--budget-tokens", type=_whole, metavar="N", help="training tokens per run (lm)")
    group = parser.add_argument_group("scaling sweep", "every variant at several sizes, loss fitted against "
                                      "compute, each method's compute multiplier (docs/compare.md)")
    group.add_argument("--sizes", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="the sizes: the i-th takes the i-th value of every such key (repeatable; at least 3 "
                            "values; d_ffn follows d_model at the base ratio unless given)")
    group.add_argument("--tokens-per-parameter", type=_positive, metavar="R",
                       help="each size's budget: the baseline's FLOPs for R tokens per parameter, the same FLOPs "
                            "for every variant of the size (instead of --budget-steps / --budget-tokens)")
    group.add_argument("--extrapolate", action="append", default=[], metavar="KEY=VALUE",
                       help="a size to extrapolate the compute multipliers to (counted, never trained; repeatable "
                            "for several keys)")
    group.add_argument("--scaling-axis", choices=get_args(Axis), default="flops",
                       help="fit the loss against training FLOPs (default) or measured training seconds")


def budgets(args: argparse.Namespace) -> dict[str, Any]:
    """The compute budgets as :func:`~interlayer.compare.make_settings` takes them."""
    return {"budget_flops": args.budget_flops, "budget_tokens": args.budget_tokens}


def replaces_steps(args: argparse.Namespace) -> bool:
    """Whether a budget other than steps was asked for (``--default``'s step budget then gives way)."""
    return any(value is not None for value in (args.budget_minutes, args.budget_flops, args.budget_tokens,
                                               args.tokens_per_parameter))


def default_sets(sets: list[str], args: argparse.Namespace) -> list[str]:
    """``--default``'s settings for a sweep: without the keys its sizes set, nor those that follow them (``d_ffn``
    of a ``d_model`` sweep), which the sizes decide."""
    swept = {entry.partition("=")[0].strip() for entry in args.sizes}
    swept |= {follower for leader in swept for follower in FOLLOWERS.get(leader, ())}
    return [entry for entry in sets if entry.partition("=")[0] not in swept]


def sweep_options(args: argparse.Namespace) -> Optional[SweepOptions]:
    """The sweep asked for (None without ``--sizes``); its other flags without ``--sizes`` are refused."""
    if not args.sizes:
        alone = [flag for flag, given in (("--tokens-per-parameter", args.tokens_per_parameter is not None),
                                          ("--extrapolate", bool(args.extrapolate)),
                                          ("--scaling-axis", args.scaling_axis != "flops")) if given]
        if alone:
            raise ConfigError(f"{', '.join(alone)} belong to a scaling sweep; give --sizes (e.g. --sizes "
                              "d_model=64,96,128,192)")
        return None
    if args.select:
        raise ConfigError("--select chooses among variants of one comparison; a scaling sweep reports every variant "
                          "(run the selection as a comparison first)")
    if getattr(args, "effect", None) is not None:
        raise ConfigError("--effect plans one comparison's seeds and adds its per-seed tables; a scaling sweep fits "
                          "every size's means instead: drop --effect, or run one size as a comparison")
    return SweepOptions(parse_sizes(args.sizes), args.tokens_per_parameter,
                        parse_size(args.extrapolate) if args.extrapolate else None, args.scaling_axis)


def run(settings: Settings, sweep: Optional[SweepOptions], output: Path, *, selections: Sequence[Selection] = (),
        effect: Optional[float] = None, **kwargs: Any) -> Any:
    """The command: :func:`~interlayer.compare.run_compare` (with ``selections`` and ``effect``), or with ``--sizes``
    :func:`~interlayer.compare.sweep.run_sweep` (both take ``command``, ``jobs``, ``margin`` and ``launcher``)."""
    from . import run_compare
    from .sweep import run_sweep

    if sweep is None:
        return run_compare(settings, output, selections=selections, effect=effect, **kwargs)
    return run_sweep(settings, sweep, output, **kwargs)
