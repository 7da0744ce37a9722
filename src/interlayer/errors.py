"""The errors every layer raises and the CLI reports (as one line, exit code 2): the bottom module of the package.

They live here, below the core, so that data, training, comparison and the command line name them without
importing the core's config or the checkpoint code, and the core imports them without reaching up.
``interlayer.ConfigError`` stays the public name of the first.
"""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot work; the message names the key, the value and what would be valid."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the requested model; the message says what differs."""


class DataError(ValueError):
    """A data file that cannot be used as it is; the message names the file, the line and what was expected."""
