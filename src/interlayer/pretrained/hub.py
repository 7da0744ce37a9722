"""One loader for every saved model: an interlayer folder, a Hugging Face folder, or a Hub repository id.

:meth:`~interlayer.core.hub.PretrainedMixin.from_pretrained` (the Hugging Face convention, on every interlayer
model class) resolves its source here:

* a local folder written by interlayer (``model.safetensors`` whose metadata says ``format: interlayer``, or a
  folder written for ``transformers`` whose ``config.json`` says ``model_type: interlayer``) is rebuilt by
  :func:`interlayer.load_pretrained`, ties and all;
* a local ``transformers`` folder of a supported family is imported by :func:`~interlayer.pretrained.hf.from_hf`;
* anything else is taken for a Hub repository id and fetched with ``huggingface_hub.snapshot_download`` (its
  cache first; the network only when the files are not cached and ``local_files_only`` is False), then loaded as
  above. ``huggingface_hub`` is optional: interlayer does not depend on it, and without it only local folders load.

``huggingface_hub.PyTorchModelHubMixin`` is not used: subclassing it would make ``huggingface_hub`` a hard
dependency of every model class, and its ``config.json`` convention (constructor keyword arguments) differs from
interlayer's (the model's dataclass config, with the tie map in the weights' metadata).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

from safetensors import SafetensorError, safe_open
from torch import nn

from ..checkpoint import CONFIG_FILE, HF_MODEL_TYPE, WEIGHTS_FILE
from ..errors import CheckpointError
from ..fileio import confined, read_json
from ..models.registry import load_pretrained
from .hf import from_hf
from .hf_files import resolve_source


def is_interlayer_folder(directory: Path) -> bool:
    """Whether ``directory`` holds a model written by :func:`interlayer.save_pretrained`."""
    weights = directory / WEIGHTS_FILE
    if not os.path.lexists(weights):
        return False
    if read_json(directory / CONFIG_FILE, CheckpointError, optional=True, within=directory
                 ).get("model_type") == HF_MODEL_TYPE:
        return True
    try:
        with safe_open(str(confined(weights, directory, CheckpointError)), framework="pt") as handle:
            return (handle.metadata() or {}).get("format") == "interlayer"
    except SafetensorError as err:
        raise CheckpointError(f"{weights}: not a readable safetensors file ({err}); it may be truncated or corrupt: "
                              "copy it again") from None


def load_model(source: Union[str, Path], *, revision: Optional[str] = None, local_files_only: bool = False,
               cache_dir: Optional[Union[str, Path]] = None, **hf_options: Any) -> nn.Module:
    """The model in ``source`` (see the module docstring); ``hf_options`` go to :func:`from_hf` for a
    ``transformers`` folder (``num_classes``, ``extra_sections``, ...)."""
    directory = resolve_source(source, revision=revision, local_files_only=local_files_only, cache_dir=cache_dir)
    if is_interlayer_folder(directory):
        if hf_options:
            raise CheckpointError(f"{directory} is an interlayer model: {', '.join(hf_options)} only apply to "
                                  "Hugging Face folders (its config is the saved one)")
        return load_pretrained(directory)
    return from_hf(directory, **hf_options)
