"""The command line's argument helpers: ``--set`` pairs, the device flags, finite numbers, and errors cut to one
line: what every command's parser in :mod:`interlayer.cli` is built from."""
from __future__ import annotations

import argparse
import math
from typing import Any, NoReturn, Sequence, get_args

from ..errors import ConfigError
from ..fileio import shorten
from ..training.config import PrecisionSetting

MESSAGE_CHARS = 2000  # an error message is cut to this (a value it quotes is cut to fileio.ECHO_CHARS already)


def parse_sets(pairs: Sequence[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` pairs as a mapping, the values as text (the experiment parses them)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects key=value (e.g. --set d_model=256 or --set crossformer.hard=kq), "
                              f"got {shorten(repr(pair))}")
        out[key] = value
    return out


def add_device_arguments(parser: argparse.ArgumentParser, training: bool) -> None:
    """``--device`` (and, for commands that train, ``--precision`` and ``--compile``): shorthands for the
    ``train.device`` / ``train.precision`` / ``train.compile`` settings (training/device.py)."""
    parser.add_argument("--device", help="auto (default: CUDA if present, else MPS, else CPU), cpu, cuda, cuda:N, mps"
                        + ("; compare --jobs N spreads runs over the GPUs when --device is auto or cuda"
                           if training else ""))
    if training:
        parser.add_argument("--precision", choices=get_args(PrecisionSetting),
                            help="auto (default: bf16 on GPUs that have it, else fp32), fp32, bf16, or fp16 with a "
                                 "gradient scaler")
        parser.add_argument("--compile", action="store_true", help="torch.compile the training model")


def device_sets(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--set`` equivalents of the device flags that were given: ``--device`` and ``--precision`` as their
    text, ``--compile`` as the boolean it is (``train.compile=True``)."""
    sets = {"train.device": args.device, "train.precision": getattr(args, "precision", None),
            "train.compile": True if getattr(args, "compile", False) else None}
    return {key: value for key, value in sets.items() if value is not None}


def finite_float(text: str) -> float:
    """An argparse type: a float that is a finite number (``float`` alone takes ``nan`` and ``inf``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number; give a finite value")
    return value


class CommandParser(argparse.ArgumentParser):
    """argparse with its usage errors cut to one short line (an argument of 5,000 digits is quoted, not printed)."""

    def error(self, message: str) -> NoReturn:
        super().error(one_line(message))


def one_line(message: str, limit: int = MESSAGE_CHARS) -> str:
    """An error message as the command line prints it: one line (a line break in a quoted value becomes a space),
    at most ``limit`` characters (the middle of a longer one left out and counted)."""
    return shorten(" ".join(message.split("\n")), limit)
