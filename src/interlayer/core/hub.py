"""What Hugging Face users call on a model, on every interlayer model class (:class:`PretrainedMixin`).

* ``model.save_pretrained(directory)`` and ``ModelClass.from_pretrained(source)``. Writing the files and
  rebuilding a model by its type (or importing a Hugging Face folder) are done above the core
  (:mod:`interlayer.checkpoint`, :mod:`interlayer.models.registry`, :mod:`interlayer.pretrained.hub`), which the
  core must not import. So the mixin calls a saver and a loader registered here with :func:`register_storage`;
  the package's ``__init__``, run before any of its modules, registers the real ones (imported when first called),
  and a model class used without them fails with a message saying so.
* **Tied weights in state dicts.** A tied parameter (one ``nn.Parameter`` under several names: the token table
  and the output head, Crossformer's hard ties, shared layers) is stored once: :func:`track_ties` makes the
  model's ``state_dict()`` leave out every name but the first of each tied tensor (``safetensors``, which
  ``transformers.Trainer`` and ``accelerate`` save plain modules with, refuses tensors that share memory) and
  record the ties in the state dict's metadata; ``load_state_dict`` puts the left-out names back from their
  first name, by the ties the state dict recorded (an untied model can load a tied one's state dict) or, for a
  state dict read from a file, the model's own. This is :mod:`interlayer.checkpoint`'s canonical state dict, made
  the one every caller gets.
* ``num_parameters``, ``dtype``, ``device``, gradient (activation) checkpointing of the layer stacks
  (``gradient_checkpointing_enable``; :class:`~interlayer.core.layers.ActivationCheckpointing`), the input and
  output embeddings and ``resize_token_embeddings`` (tied tables stay tied), as ``transformers``' ``PreTrainedModel``
  names them.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

import torch
from torch import Tensor, nn

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


TIES_METADATA = "tied"  # the key of a state dict's metadata (its ``_metadata[prefix]``) holding alias -> first name


def tied_aliases(module: nn.Module) -> dict[str, str]:
    """Every later name of a tied parameter -> its first name (``named_parameters`` order); what
    :func:`interlayer.checkpoint.tie_map` groups the other way round. The buffers of a module used in several places
    count too (predictive's shared convolution keeps one warm-up counter: ``safetensors`` refused to save it twice,
    issue 49)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in [*module.named_parameters(remove_duplicate=False),
                         *module.named_buffers(remove_duplicate=False)]:
        canonical = first.setdefault(id(tensor), name)
        if canonical != name:
            aliases[name] = canonical
    return aliases


def _drop_aliases(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any]
                  ) -> None:
    """State-dict post-hook of :func:`track_ties`: each tied tensor under its first name only."""
    aliases = tied_aliases(module)
    for alias in aliases:
        state_dict.pop(prefix + alias, None)
    if aliases:
        local_metadata[TIES_METADATA] = aliases


def _restore_aliases(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any],
                     *_: Any) -> None:
    """Load pre-hook of :func:`track_ties`: a left-out tied name reads the tensor of its first name."""
    recorded = local_metadata.get(TIES_METADATA)
    aliases = dict(recorded) if isinstance(recorded, dict) else {}
    aliases.update(tied_aliases(module))
    for alias, canonical in aliases.items():
        if prefix + alias not in state_dict and prefix + canonical in state_dict:
            state_dict[prefix + alias] = state_dict[prefix + canonical]


def track_ties(model: nn.Module) -> None:
    """Store each tied tensor of ``model`` once in its state dicts, and restore the other names on loading (see the
    module docstring). Every interlayer model class calls this in ``__init__``."""
    model.register_state_dict_post_hook(_drop_aliases)
    model.register_load_state_dict_pre_hook(_restore_aliases)


class PretrainedMixin:
    """Saving and loading as methods of a model class (``nn.Module`` subclasses), and the other calls
    ``transformers``' ``PreTrainedModel`` users make (module docstring)."""

    main_input_name = "input_ids"  # what transformers.Trainer counts tokens and FLOPs by
    supports_gradient_checkpointing = True

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters (of the first one; the CPU for a model without any)."""
        first = next(self.parameters(), None)  # type: ignore[attr-defined]
        return first.device if first is not None else torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's floating-point parameters (of the first one; float32 without any)."""
        floating = (p.dtype for p in self.parameters() if p.is_floating_point())  # type: ignore[attr-defined]
        return next(floating, torch.float32)

    # -- activation checkpointing ---------------------------------------------------------------------------------
    def _stacks(self) -> list[nn.Module]:
        stacks = [m for m in self.modules() if hasattr(m, "activation_checkpointing")]  # type: ignore[attr-defined]
        if not stacks:
            raise ValueError(f"{type(self).__name__} has no Transformer layer stack to checkpoint (activation "
                             "checkpointing covers the core's encoder and decoder stacks)")
        return stacks

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: Optional[dict[str, Any]] = None,
                                        every_n_layers: int = 1, offload: bool = False) -> None:
        """Checkpoint every ``every_n_layers``-th layer of each stack in training (recomputed in the backward pass:
        less memory, about one more forward pass of time); ``activation_checkpointing_kwargs`` go to
        ``torch.utils.checkpoint.checkpoint`` (default ``use_reentrant=False``), ``offload`` keeps the saved inputs
        in host memory. What ``TrainingArguments(gradient_checkpointing=True)`` calls."""
        from .layers import ActivationCheckpointing  # here: `import interlayer` loads this module, not the layers

        if not isinstance(every_n_layers, int) or every_n_layers < 1:
            raise ValueError(f"every_n_layers={every_n_layers!r} must be a positive integer (1: every layer)")
        options = {"use_reentrant": False, **(activation_checkpointing_kwargs or {})}
        setting = ActivationCheckpointing(every_n_layers, offload, tuple(options.items()))
        for stack in self._stacks():
            stack.activation_checkpointing = setting

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: Optional[dict[str, Any]] = None,
                                      every_n_layers: int = 1, offload: bool = False) -> None:
        """``transformers``' older name of :meth:`activation_checkpointing_enable`."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, every_n_layers, offload)

    def activation_checkpointing_disable(self) -> None:
        for stack in self._stacks():
            stack.activation_checkpointing = None

    def gradient_checkpointing_disable(self) -> None:
        self.activation_checkpointing_disable()

    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(getattr(m, "activation_checkpointing", None) is not None
                   for m in self.modules())  # type: ignore[attr-defined]

    is_activation_checkpointing = is_gradient_checkpointing

    # -- embeddings -----------------------------------------------------------------------------------------------
    def get_input_embeddings(self) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} has no token table")

    def set_input_embeddings(self, value: nn.Module) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no token table")

    def get_output_embeddings(self) -> Optional[nn.Module]:
        """The projection onto the vocabulary (a language model's head), or None (a classifier has none)."""
        return None

    def set_output_embeddings(self, value: nn.Module) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no output embeddings")

    def resize_token_embeddings(self, new_num_tokens: Optional[int] = None, pad_to_multiple_of: Optional[int] = None,
                                mean_resizing: bool = True) -> nn.Module:
        """Give the token table (and the output projection, tied or not) ``new_num_tokens`` rows, rounded up to a
        multiple of ``pad_to_multiple_of``: existing rows are kept, new ones start at the mean of the old rows with
        ``mean_resizing`` (``transformers`` draws them from a normal around that mean with a covariance of 1e-5
        times the old rows'; the mean is its expectation) or at the table's own initialisation; ``vocab_size``
        follows. A tied head stays tied. Returns the new table (the current one when nothing is given)."""
        table = self.get_input_embeddings()
        if not isinstance(table, nn.Embedding):
            raise NotImplementedError(f"{type(self).__name__}'s token table is a {type(table).__name__}")
        if new_num_tokens is None and pad_to_multiple_of is None:
            return table
        rows = table.num_embeddings if new_num_tokens is None else new_num_tokens
        if pad_to_multiple_of is not None:
            if pad_to_multiple_of < 1:
                raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of} must be a positive integer")
            rows = math.ceil(rows / pad_to_multiple_of) * pad_to_multiple_of
        if rows < 1 or (table.padding_idx is not None and rows <= table.padding_idx):
            raise ValueError(f"new_num_tokens={rows} leaves no room for the table's rows (padding id "
                             f"{table.padding_idx}); give at least {(table.padding_idx or 0) + 1}")
        head = self.get_output_embeddings()
        tied = head is not None and head.weight is table.weight
        new_table = nn.Embedding(rows, table.embedding_dim, padding_idx=table.padding_idx,
                                 device=table.weight.device, dtype=table.weight.dtype)
        _copy_rows(table.weight, new_table.weight, mean_resizing)
        self.set_input_embeddings(new_table)
        if head is not None and not tied:
            new_head = nn.Linear(head.in_features, rows, bias=head.bias is not None, device=head.weight.device,
                                 dtype=head.weight.dtype)
            _copy_rows(head.weight, new_head.weight, mean_resizing)
            if head.bias is not None:
                with torch.no_grad():
                    new_head.bias.zero_()
                    new_head.bias[: min(rows, head.out_features)] = head.bias[:rows]
            self.set_output_embeddings(new_head)
        self.config.src_vocab_size = rows  # type: ignore[attr-defined]
        return new_table

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
                        cache_dir: Optional[Union[str, Path]] = None, torch_dtype: Optional[torch.dtype] = None,
                        **hf_options: Any) -> ModelT:
        """The model saved in ``source`` (an interlayer folder, a Hugging Face folder of a supported family, or a
        Hub repository id; :mod:`interlayer.pretrained.hub`), moved to ``device``, cast to ``dtype`` and in eval
        mode, as ``transformers``' ``from_pretrained`` returns models.

        It must be an instance of this class (``EncoderClassifier.from_pretrained`` refuses an image model);
        ``hf_options`` go to :func:`~interlayer.pretrained.hf.from_hf` for Hugging Face folders; ``torch_dtype`` is
        ``transformers``' older name of ``dtype``.
        """
        if torch_dtype is not None:
            if dtype is not None:
                raise TypeError("got both dtype and torch_dtype; torch_dtype is transformers' older name of dtype")
            dtype = torch_dtype
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


def _copy_rows(old: Tensor, new: Tensor, mean_resizing: bool) -> None:
    """The first rows of ``new`` from ``old``; further rows the mean of ``old``'s (or left as initialised)."""
    kept = min(old.shape[0], new.shape[0])
    with torch.no_grad():
        if mean_resizing and new.shape[0] > kept:
            new[kept:] = old.mean(dim=0, keepdim=True)
        elif new.shape[0] > kept:
            nn.init.normal_(new[kept:], std=float(old.std()))
        new[:kept] = old[:kept]
