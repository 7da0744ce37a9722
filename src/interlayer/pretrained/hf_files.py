"""Reading a Hugging Face folder's files safely: where the folder is (:func:`resolve_source`: a local folder or a
Hub repository in the local cache) and its tensors (:func:`read_weights`: safetensors or a ``.bin``, sharded or
not, every file confined to the folder). :mod:`interlayer.pretrained.hf` builds models from them.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from .. import fileio
from ..errors import PretrainedError
from ..fileio import read_json

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def read_weights(directory: Union[str, Path]) -> dict[str, Tensor]:
    """All tensors of the checkpoint, from safetensors or a ``.bin`` (``weights_only=True``), sharded or not.

    Every file read is confined to ``directory``: a shard index (``weight_map``) naming an absolute path, a ``..``
    or a link out of the folder is refused, and so is anything but a regular file (a FIFO would hang the read).
    """
    directory = Path(directory)
    for name in WEIGHT_FILES:
        path = directory / name
        if not os.path.lexists(path):
            continue
        fileio.confined(path, directory, PretrainedError)
        if name.endswith(".index.json"):
            return {k: v for shard in _shards(directory, path) for k, v in _read_one(shard).items()}
        return _read_one(path)
    present = sorted(p.name for p in directory.iterdir())
    raise PretrainedError(f"{directory} has no PyTorch weights: expected one of {', '.join(WEIGHT_FILES)}, found "
                          f"{present} (convert TensorFlow/Flax checkpoints with transformers first)")


def _shards(directory: Path, index: Path) -> list[Path]:
    """The shard files of an index, each confined to ``directory`` (:func:`interlayer.fileio.confined`)."""
    data = read_json(index, PretrainedError)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise PretrainedError(f"{index}: no weight_map (a JSON object of tensor name -> shard file), so it is not a "
                              "shard index")
    shards = []
    for name in sorted({str(v) for v in weight_map.values()}):
        if not name or Path(name).is_absolute() or ".." in Path(name).parts:
            raise PretrainedError(f"{index}: weight_map names the shard {name!r}; a shard must be a file inside "
                                  f"{directory} (no absolute path, no '..'): refused")
        shards.append(fileio.confined(directory / name, directory, PretrainedError, named_by=index))
    return shards


def _read_one(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as err:
            raise PretrainedError(f"{path}: not a readable safetensors file ({err}); it may be truncated or "
                                  "corrupt: copy it again") from None
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise PretrainedError(f"{path} holds Python objects besides tensors, which interlayer does not unpickle "
                              "(unpickling a file can run any code it names); it reads plain state dicts only. "
                              "Use the model's model.safetensors, or convert this file where you trust it") from None
    except (RuntimeError, OSError, EOFError, ValueError) as err:
        raise PretrainedError(f"{path}: not a readable PyTorch weights file ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); it may be truncated or corrupt"
                              ) from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise PretrainedError(f"{path} does not hold a state dict of tensors (got {type(state).__name__})")
    return state


def resolve_source(source: Union[str, Path], *, revision: Optional[str] = None, local_files_only: bool = False,
                   cache_dir: Optional[Union[str, Path]] = None) -> Path:
    """A local folder for ``source``: itself when it is a directory, else the snapshot of Hub repository
    ``source`` in the local Hugging Face cache (``cache_dir``, default ``HF_HUB_CACHE``), downloaded first when it
    is not cached, unless ``local_files_only`` (or ``HF_HUB_OFFLINE=1``) says not to. ``huggingface_hub`` is
    optional (``transformers`` brings it): without it only local folders load."""
    path = Path(source)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import constants, errors, snapshot_download
    except ImportError:
        raise PretrainedError(f"{source} is not a local folder, and reading it as a Hugging Face Hub id needs the "
                              "optional package huggingface_hub (pip install huggingface_hub)") from None
    try:
        return Path(snapshot_download(repo_id=str(source), revision=revision, cache_dir=cache_dir,
                                      local_files_only=local_files_only))
    except errors.LocalEntryNotFoundError:
        where = cache_dir or constants.HF_HUB_CACHE
        raise PretrainedError(f"{source} is not a local folder, and as a Hugging Face Hub id it is not in the local "
                              f"cache ({where}) and was not downloaded (offline, or local_files_only): fetch it "
                              f"once with `hf download {source}` (or `huggingface-cli download {source}`) where "
                              "the Hub is reachable, or pass the model's folder") from None
    except (OSError, ValueError) as err:  # the hub's not-found and HTTP errors are OSErrors; a bad id a ValueError
        raise PretrainedError(f"{source} is not a local folder and could not be fetched from the Hugging Face Hub: "
                              f"{type(err).__name__}: {err}") from None
