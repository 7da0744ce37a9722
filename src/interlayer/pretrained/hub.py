"""One loader for every saved model: an interlayer folder, a Hugging Face folder, or a Hub repository id.

:meth:`~interlayer.core.hub.PretrainedMixin.from_pretrained` (the Hugging Face convention, on every interlayer
model class) resolves its source here:

* a local folder written by interlayer (``model.safetensors`` whose metadata says ``format: interlayer``) is
  rebuilt by :func:`interlayer.load_pretrained`, ties and all;
* a local ``transformers`` folder of a supported family is imported by :func:`~interlayer.pretrained.from_hf`;
* anything else is taken for a Hub repository id and fetched with ``huggingface_hub.snapshot_download`` (its
  cache first; the network only when the files are not cached and ``local_files_only`` is False), then loaded as
  above. ``huggingface_hub`` is optional: interlayer does not depend on it, and without it only local folders load.

``huggingface_hub.PyTorchModelHubMixin`` is not used: subclassing it would make ``huggingface_hub`` a hard
dependency of every model class, and its ``config.json`` convention (constructor keyword arguments) differs from
interlayer's (the model's dataclass config, with the tie map in the weights' metadata).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Optional, Union

from safetensors import safe_open
from torch import nn

from ..checkpoint import WEIGHTS_FILE, CheckpointError, load_pretrained
from .hf import from_hf


def is_interlayer_folder(directory: Path) -> bool:
    """Whether ``directory`` holds a model written by :func:`interlayer.save_pretrained`."""
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        return False
    with safe_open(str(weights), framework="pt") as handle:
        return (handle.metadata() or {}).get("format") == "interlayer"


def resolve(source: Union[str, Path], *, revision: Optional[str] = None, local_files_only: bool = False) -> Path:
    """A local folder for ``source``: itself when it is a directory, else a Hub snapshot of repository ``source``."""
    path = Path(source)
    if path.is_dir():
        return path
    try:
        hub = importlib.import_module("huggingface_hub")
    except ImportError:
        raise CheckpointError(f"{source} is not a local folder, and loading it from the Hugging Face Hub needs the "
                              "optional package huggingface_hub (pip install huggingface_hub)") from None
    try:
        return Path(hub.snapshot_download(repo_id=str(source), revision=revision, local_files_only=local_files_only))
    except (OSError, ValueError) as err:  # the hub's offline, not-found and HTTP errors are OSErrors; a bad id a
        # ValueError
        raise CheckpointError(f"{source} is not a local folder and could not be fetched from the Hugging Face Hub: "
                              f"{type(err).__name__}: {err}") from None


def load_model(source: Union[str, Path], *, revision: Optional[str] = None, local_files_only: bool = False,
               **hf_options: Any) -> nn.Module:
    """The model in ``source`` (see the module docstring); ``hf_options`` go to :func:`from_hf` for a
    ``transformers`` folder (``num_classes``, ``extra_sections``, ...)."""
    directory = resolve(source, revision=revision, local_files_only=local_files_only)
    if is_interlayer_folder(directory):
        if hf_options:
            raise CheckpointError(f"{directory} is an interlayer model: {', '.join(hf_options)} only apply to "
                                  "Hugging Face folders (its config is the saved one)")
        return load_pretrained(directory)
    return from_hf(directory, **hf_options)
