"""``model.save_pretrained(directory)`` and ``ModelClass.from_pretrained(source)``: the Hugging Face convention.

Writing the files and rebuilding a model by its type (or importing a Hugging Face folder) are done above the core
(:mod:`interlayer.checkpoint`, :mod:`interlayer.models.registry`, :mod:`interlayer.pretrained.hub`), which the
core must not import. So the mixin calls a saver and a loader registered here with :func:`register_storage`;
the package's ``__init__``, run before any of its modules, registers the real ones (imported when first called),
and a model class used without them fails with a message saying so.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

import torch

from ..errors import CheckpointError
from .positions import LearnedPositions

ModelT = TypeVar("ModelT", bound="PretrainedMixin")
Saver = Callable[[Any, Path], Path]  # (model, directory) -> directory
Loader = Callable[..., Any]  # (source, *, revision, local_files_only, cache_dir, **hf_options) -> model
_STORAGE: dict[str, Callable[..., Any]] = {}


def register_storage(*, save: Saver, load: Loader) -> None:
    """Give :class:`PretrainedMixin` the functions that write a model folder and load any saved model."""
    _STORAGE.update(saver=save, loader=load)


def _storage(role: str) -> Callable[..., Any]:
    if role not in _STORAGE:
        raise RuntimeError(f"no model {role} is registered: interlayer.core.hub.register_storage(save=..., "
                           "load=...) is called by the interlayer package's __init__; call it yourself when using "
                           "the core without the package")
    return _STORAGE[role]


class PretrainedMixin:
    """Saving and loading as methods of a model class (``nn.Module`` subclasses), and ``num_parameters``."""

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """As ``transformers``' ``PreTrainedModel.num_parameters``: each parameter once (a tied one is counted
        once), only those that train when ``only_trainable``, without the token and absolute position tables
        (``nn.Embedding`` and ``LearnedPositions`` weights, GPT-2's ``wte`` and ``wpe``) when
        ``exclude_embeddings``. :func:`interlayer.count_parameters` says more."""
        tables = (torch.nn.Embedding, LearnedPositions)
        embeddings = ({id(m.weight) for m in self.modules() if isinstance(m, tables)}  # type: ignore[attr-defined]
                      if exclude_embeddings else set())
        return sum(p.numel() for p in self.parameters()  # type: ignore[attr-defined]
                   if (p.requires_grad or not only_trainable) and id(p) not in embeddings)

    def save_pretrained(self, directory: Union[str, Path]) -> Path:
        """Write ``config.json`` and ``model.safetensors`` (ties kept); :func:`interlayer.save_pretrained`."""
        return _storage("saver")(self, Path(directory))

    @classmethod
    def from_pretrained(cls: type[ModelT], source: Union[str, Path], *,
                        device: Optional[Union[str, torch.device]] = None, dtype: Optional[torch.dtype] = None,
                        revision: Optional[str] = None, local_files_only: bool = False,
                        cache_dir: Optional[Union[str, Path]] = None, **hf_options: Any) -> ModelT:
        """The model saved in ``source`` (an interlayer folder, a Hugging Face folder of a supported family, or a
        Hub repository id; :mod:`interlayer.pretrained.hub`), moved to ``device``, cast to ``dtype`` and in eval
        mode, as ``transformers``' ``from_pretrained`` returns models.

        It must be an instance of this class (``EncoderClassifier.from_pretrained`` refuses an image model);
        ``hf_options`` go to :func:`~interlayer.pretrained.from_hf` for Hugging Face folders.
        """
        model = _storage("loader")(source, revision=revision, local_files_only=local_files_only, cache_dir=cache_dir,
                           **hf_options)
        if not isinstance(model, cls):
            raise CheckpointError(f"{source} holds a {type(model).__name__}, not a {cls.__name__}; load it with "
                                  f"{type(model).__name__}.from_pretrained or interlayer.load_pretrained")
        if device is not None:
            model = model.to(device)
        if dtype is not None:
            model = model.to(dtype)
        return model.eval()
