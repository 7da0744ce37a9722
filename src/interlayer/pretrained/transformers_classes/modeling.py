"""interlayer models as ``transformers`` models: the classes ``AutoModel*`` load ``model_type: "interlayer"`` folders
with.

Each class is a ``transformers.PreTrainedModel`` holding the interlayer model as ``self.interlayer`` (built from
the config's ``interlayer`` section, :mod:`.configuration`, every method and tie included), so code written for
``transformers`` (``AutoModelForCausalLM.from_pretrained``, ``pipeline``, ``Trainer``, ``generate``) runs
interlayer's computation unchanged:

* :class:`InterlayerForCausalLM` (a language model: ``AutoModelForCausalLM``, ``pipeline("text-generation")``),
  :class:`InterlayerForSequenceClassification` (a text classifier), :class:`InterlayerForImageClassification`
  (an image classifier), :class:`InterlayerModel` (any of them: ``AutoModel``, the last hidden states);
* **files**: ``config.json`` (:class:`~.configuration.InterlayerConfig`), ``model.safetensors``
  (this class's state dict: the interlayer model's names under ``interlayer.``, each tied tensor once, the tie
  map in the metadata), ``generation_config.json`` for a language model. ``from_pretrained`` and
  ``save_pretrained`` are interlayer's, not ``transformers``' generic ones: the model is built on the CPU as
  interlayer builds it (``transformers`` would build it on the meta device and then lose the buffers interlayer
  computes at construction) and ``state_dict()`` loads into it; ``interlayer.load_pretrained`` reads the same
  folder, and ``from_pretrained`` reads the folders of ``interlayer.save_pretrained`` (``model.save_pretrained``:
  the same ``config.json``, the tensors under interlayer's own names);
* **generation**: :meth:`InterlayerForCausalLM.generate` runs interlayer's own decoding (with its key/value
  cache and beam search, token for token what ``transformers`` does: :mod:`interlayer.core.hf_generation`) for
  the options it implements, and ``transformers``' own ``generate`` for any other (logits processors, stop
  strings, streamers, ...), then reading the whole sequence at every step: interlayer's cache is not a
  ``transformers`` cache;
* the training hooks (gradient checkpointing, embeddings, ``resize_token_embeddings``) are the interlayer
  model's (:mod:`interlayer.core.hub`).

This module and those it imports are what ``interlayer export --with-code`` copies into a folder
(:mod:`.remote_code`), so it imports only the model-building part of interlayer
(``build``, ``config``, ``core``, ``methods``); other interlayer families (the image models) are built through
:data:`FALLBACK_BUILDER`, which ``import interlayer`` sets to the registry.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from safetensors.torch import load_file
from torch import Tensor, nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.generation.utils import GenerateBeamDecoderOnlyOutput, GenerateDecoderOnlyOutput
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    CausalLMOutputWithPast,
    ImageClassifierOutput,
    SequenceClassifierOutput,
)

from ...build import build_model
from ...checkpoint import HF_PREFIX, model_kind, save_for_transformers, transformers_config
from ...config import config_from_dict
from ...core.hf_generation import GenerateOutput, generate_like_hf
from ...errors import UnsupportedGenerationOption
from .configuration import InterlayerConfig

WEIGHTS_NAME = "model.safetensors"
GENERATION_CONFIG_NAME = "generation_config.json"
Builder = Callable[[dict[str, Any]], nn.Module]
# interlayer model type -> (config dict -> model); the Transformer family here, the others through the registry
BUILDERS: dict[str, Builder] = {
    "transformer": lambda data: build_model(config_from_dict(data, "config.json interlayer"))}
FALLBACK_BUILDER: Optional[Callable[[str, dict[str, Any]], nn.Module]] = None  # (model type, config) -> model
# transformers' from_pretrained options that need nothing here (hub bookkeeping, loading strategies of its own)
QUIET_OPTIONS = ("trust_remote_code", "_from_auto", "_from_pipeline", "adapter_kwargs", "code_revision",
                 "low_cpu_mem_usage", "use_safetensors", "attn_implementation", "force_download", "proxies",
                 "resume_download", "output_loading_info", "offload_folder", "offload_state_dict", "key_mapping",
                 "weights_only", "_commit_hash")


def build_interlayer(config: InterlayerConfig) -> nn.Module:
    """The interlayer model ``config.interlayer`` describes, freshly initialised."""
    model_type, data = config.interlayer_model_type, config.interlayer_config
    if not data:
        raise ValueError("config.json has no interlayer section: it was not written by interlayer (an interlayer "
                         "folder's config.json holds {'interlayer': {'model_type': ..., 'config': {...}}})")
    if model_type in BUILDERS:
        return BUILDERS[model_type](data)
    if FALLBACK_BUILDER is None:
        raise ValueError(f"interlayer model type {model_type!r} is built by the interlayer package: install it and "
                         "`import interlayer` (this folder's own code covers language models and text classifiers)")
    return FALLBACK_BUILDER(model_type, data)


def _resolve(source: Union[str, Path], options: dict[str, Any]) -> Path:
    """A local folder for ``source`` (a folder, or a Hub repository id fetched into the Hugging Face cache)."""
    subfolder = options.pop("subfolder", None) or ""
    path = Path(source)
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(repo_id=str(source), revision=options.pop("revision", None),
                                      cache_dir=options.pop("cache_dir", None), token=options.pop("token", None),
                                      local_files_only=options.pop("local_files_only", False)))
    for key in ("revision", "cache_dir", "token", "local_files_only"):
        options.pop(key, None)
    return path / subfolder


def _dtype(value: Any, state: dict[str, Tensor]) -> Optional[torch.dtype]:
    if value is None or value == "auto":
        return next((t.dtype for t in state.values() if t.is_floating_point()), None)
    if isinstance(value, torch.dtype):
        return value
    chosen = getattr(torch, str(value).removeprefix("torch."), None)
    if not isinstance(chosen, torch.dtype):
        raise ValueError(f"dtype={value!r} is not a torch dtype")
    return chosen


class InterlayerPreTrainedModel(PreTrainedModel):
    """What every class here shares: building, loading and saving, the interlayer model's training hooks."""

    config_class = InterlayerConfig
    base_model_prefix = "interlayer"
    supports_gradient_checkpointing = True
    kinds: tuple[str, ...] = ()  # the interlayer models this class holds (empty: any)
    auto_class = "AutoModel"

    def __init__(self, config: InterlayerConfig, model: Optional[nn.Module] = None) -> None:
        super().__init__(config)
        self.interlayer = model if model is not None else build_interlayer(config)
        self.main_input_name = getattr(self.interlayer, "main_input_name", "input_ids")
        kind = model_kind(self.interlayer)
        if self.kinds and kind not in self.kinds:
            suggestion = {"causal_lm": "AutoModelForCausalLM", "encoder_classifier":
                          "AutoModelForSequenceClassification", "image": "AutoModelForImageClassification"}
            raise ValueError(f"this interlayer model is a {kind!r} model, which {type(self).__name__} does not hold; "
                             f"load it with {suggestion.get(kind, 'AutoModel')}")
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing: interlayer initialises its modules when it builds them."""

    def tie_weights(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: interlayer's ties are parameters shared by construction, kept by the state dicts."""

    # -- the interlayer model's training hooks -------------------------------------------------------------------
    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: Optional[dict[str, Any]] = None,
                                        every_n_layers: int = 1, offload: bool = False) -> None:
        self.interlayer.activation_checkpointing_enable(activation_checkpointing_kwargs, every_n_layers, offload)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: Optional[dict[str, Any]] = None,
                                      every_n_layers: int = 1, offload: bool = False) -> None:
        self.interlayer.activation_checkpointing_enable(gradient_checkpointing_kwargs, every_n_layers, offload)

    def activation_checkpointing_disable(self) -> None:
        self.interlayer.activation_checkpointing_disable()

    def gradient_checkpointing_disable(self) -> None:
        self.interlayer.activation_checkpointing_disable()

    @property
    def is_gradient_checkpointing(self) -> bool:  # type: ignore[override]
        return self.interlayer.is_gradient_checkpointing

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """The interlayer model's count (each tied tensor once): ``exclude_embeddings`` leaves out its token and
        learned position tables, as GPT-2's ``wte`` and ``wpe`` (``transformers``' own count knows only
        ``nn.Embedding`` modules, and interlayer's position table is not one)."""
        return self.interlayer.num_parameters(only_trainable=only_trainable, exclude_embeddings=exclude_embeddings)

    def get_input_embeddings(self) -> nn.Module:
        return self.interlayer.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.interlayer.set_input_embeddings(value)

    def get_output_embeddings(self) -> Optional[nn.Module]:
        return self.interlayer.get_output_embeddings()

    def resize_token_embeddings(self, new_num_tokens: Optional[int] = None, pad_to_multiple_of: Optional[int] = None,
                                mean_resizing: bool = True) -> nn.Module:
        table = self.interlayer.resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        self.config.vocab_size = table.num_embeddings
        self.config.interlayer["config"] = self.interlayer.config.to_dict()
        return table

    # -- files ----------------------------------------------------------------------------------------------------
    @classmethod
    def from_interlayer(cls, model: nn.Module) -> "InterlayerPreTrainedModel":
        """This class around an interlayer model (the same module, not a copy): what ``save_pretrained`` then
        writes is a folder ``AutoModel*`` loads."""
        settings = {k: v for k, v in transformers_config(model, cls.__name__).items() if k != "model_type"}
        return cls(InterlayerConfig(**settings), model=model)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Union[str, Path], *model_args: Any,
                        config: Optional[InterlayerConfig] = None, **options: Any) -> "InterlayerPreTrainedModel":
        """The model in a folder (or Hub repository) this class's :meth:`save_pretrained` or ``interlayer export``
        wrote, in eval mode; ``dtype`` (or ``torch_dtype``) casts it (default ``"auto"``: as stored),
        ``device_map`` a device name moves it there (``"auto"``: the GPU when there is one)."""
        if model_args:
            raise TypeError(f"{cls.__name__}.from_pretrained takes no positional model arguments")
        directory = _resolve(pretrained_model_name_or_path, options)
        dtype = options.pop("dtype", None) or options.pop("torch_dtype", None)
        options.pop("torch_dtype", None)
        device_map = options.pop("device_map", None)
        for key in QUIET_OPTIONS:
            options.pop(key, None)
        if options:
            raise TypeError(f"{cls.__name__}.from_pretrained does not take {sorted(options)}: the model is the one "
                            "its config.json's interlayer section describes (change it with interlayer)")
        config = config if config is not None else InterlayerConfig.from_pretrained(str(directory))
        model = cls(config)
        weights = directory / WEIGHTS_NAME
        if not weights.is_file():
            raise OSError(f"{directory} has no {WEIGHTS_NAME}")
        state = load_file(str(weights))
        if state and not any(name.startswith(HF_PREFIX) for name in state):  # interlayer.save_pretrained's names
            state = {HF_PREFIX + name: tensor for name, tensor in state.items()}
        try:
            model.load_state_dict(state)
        except RuntimeError as err:
            raise ValueError(f"{weights} does not fit the model its config.json describes: {err}") from None
        if (directory / GENERATION_CONFIG_NAME).is_file() and model.can_generate():
            model.generation_config = GenerationConfig.from_pretrained(str(directory))
        chosen = _dtype(dtype, state)
        if chosen is not None:
            model = model.to(chosen)
        if isinstance(device_map, (str, torch.device)):
            auto = "cuda" if torch.cuda.is_available() else "cpu"
            model = model.to(auto if device_map == "auto" else device_map)
        elif device_map is not None:
            raise ValueError(f"device_map={device_map!r}: interlayer models load on one device (a name, or 'auto')")
        return model.eval()

    def save_pretrained(self, save_directory: Union[str, Path], is_main_process: bool = True,
                        state_dict: Optional[dict[str, Tensor]] = None, push_to_hub: bool = False,
                        **options: Any) -> None:
        """``config.json``, ``model.safetensors`` (``state_dict``, default this model's) and, for a language
        model, ``generation_config.json``: what :meth:`from_pretrained`, ``AutoModel*`` and
        ``interlayer.load_pretrained`` read. ``push_to_hub`` is not done here (``huggingface_hub``'s
        ``upload_folder`` uploads the folder)."""
        if push_to_hub:
            raise NotImplementedError("push_to_hub: save the folder, then upload it with huggingface_hub's "
                                      "upload_folder (or `hf upload`)")
        if not is_main_process:
            return
        self.config.architectures = [type(self).__name__]
        self.config.interlayer["config"] = self.interlayer.config.to_dict()
        save_for_transformers(self.interlayer, save_directory, self.config.to_dict(), state=state_dict or
                              self.state_dict())
        if self.can_generate() and self.generation_config is not None:
            self.generation_config.save_pretrained(str(save_directory))


# -- outputs: transformers' classes, plus the interlayer terms a loss is made of ------------------------------------
@dataclass
class InterlayerCausalLMOutput(CausalLMOutputWithPast):
    aux_losses: Optional[dict[str, Tensor]] = None  # auxiliary losses (Crossformer-SG, ...), in a training ``loss``
    lm_loss: Optional[Tensor] = None  # with labels: the next-token cross-entropy alone (``loss`` in eval mode)


@dataclass
class InterlayerSequenceClassifierOutput(SequenceClassifierOutput):
    aux_losses: Optional[dict[str, Tensor]] = None


@dataclass
class InterlayerImageClassifierOutput(ImageClassifierOutput):
    aux_losses: Optional[dict[str, Tensor]] = None


def _finish(output: Any, return_dict: Optional[bool]) -> Any:
    return output if return_dict is not False else output.to_tuple()


class InterlayerModel(InterlayerPreTrainedModel):
    """Any interlayer model, read for its states: ``last_hidden_state``, ``pooler_output`` (a classifier's pooled
    vector), ``hidden_states``, ``attentions`` (``AutoModel``; the ``feature-extraction`` pipeline)."""

    def forward(self, *args: Any, return_dict: Optional[bool] = None, output_hidden_states: Optional[bool] = None,
                output_attentions: Optional[bool] = None, **inputs: Any) -> Any:
        out = self.interlayer(*args, output_hidden_states=bool(output_hidden_states),
                              output_attentions=bool(output_attentions), **inputs)
        return _finish(BaseModelOutputWithPooling(last_hidden_state=out.last_hidden_state,
                                                  pooler_output=getattr(out, "pooled", None),
                                                  hidden_states=out.hidden_states, attentions=out.attentions),
                       return_dict)


class InterlayerForSequenceClassification(InterlayerPreTrainedModel):
    """An interlayer text classifier (``AutoModelForSequenceClassification``, ``pipeline("text-classification")``)."""

    kinds = ("encoder_classifier",)
    auto_class = "AutoModelForSequenceClassification"

    def forward(self, input_ids: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                token_type_ids: Optional[Tensor] = None, inputs_embeds: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, output_hidden_states: Optional[bool] = None,
                output_attentions: Optional[bool] = None, return_dict: Optional[bool] = None) -> Any:
        out = self.interlayer(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                              inputs_embeds=inputs_embeds, labels=labels,
                              output_hidden_states=bool(output_hidden_states),
                              output_attentions=bool(output_attentions))
        return _finish(InterlayerSequenceClassifierOutput(loss=out.loss, logits=out.logits,
                                                          hidden_states=out.hidden_states,
                                                          attentions=out.attentions,
                                                          aux_losses=out.aux_losses or None), return_dict)


class InterlayerForImageClassification(InterlayerPreTrainedModel):
    """An interlayer image classifier (``AutoModelForImageClassification``); pixels in [0, 1], the model normalises
    them itself (its ``pixel_mean``/``pixel_std``)."""

    kinds = ("image",)
    auto_class = "AutoModelForImageClassification"

    def forward(self, pixel_values: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                output_hidden_states: Optional[bool] = None, output_attentions: Optional[bool] = None,
                return_dict: Optional[bool] = None) -> Any:
        out = self.interlayer(pixel_values=pixel_values, labels=labels,
                              output_hidden_states=bool(output_hidden_states),
                              output_attentions=bool(output_attentions))
        return _finish(InterlayerImageClassifierOutput(loss=out.loss, logits=out.logits,
                                                       hidden_states=out.hidden_states, attentions=out.attentions,
                                                       aux_losses=out.aux_losses or None), return_dict)


class InterlayerForCausalLM(InterlayerPreTrainedModel, GenerationMixin):
    """An interlayer language model (``AutoModelForCausalLM``, ``pipeline("text-generation")``)."""

    kinds = ("causal_lm",)
    auto_class = "AutoModelForCausalLM"

    def forward(self, input_ids: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                position_ids: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                past_key_values: Any = None, use_cache: Optional[bool] = None,
                output_hidden_states: Optional[bool] = None, output_attentions: Optional[bool] = None,
                return_dict: Optional[bool] = None, cache_position: Optional[Tensor] = None,
                logits_to_keep: Union[int, Tensor] = 0) -> Any:
        """The whole sequence's logits (``transformers``' ``past_key_values`` are not interlayer's cache: a
        non-empty one is refused; :meth:`generate` decodes with interlayer's)."""
        if past_key_values is not None and getattr(past_key_values, "get_seq_length", lambda: 0)() > 0:
            raise ValueError("interlayer models do not read transformers' key/value caches; pass the whole sequence "
                             "(generate() uses interlayer's own cache)")
        out = self.interlayer(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              labels=labels, output_hidden_states=bool(output_hidden_states),
                              output_attentions=bool(output_attentions))
        logits = out.logits
        if isinstance(logits_to_keep, int) and logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, Tensor):
            logits = logits[:, logits_to_keep]
        return _finish(InterlayerCausalLMOutput(loss=out.loss, logits=logits, hidden_states=out.hidden_states,
                                                attentions=out.attentions, aux_losses=out.aux_losses or None,
                                                lm_loss=out.lm_loss), return_dict)

    def prepare_inputs_for_generation(self, input_ids: Tensor, **kwargs: Any) -> dict[str, Any]:
        """The whole sequence at every step (``transformers``' own ``generate``, the fallback of :meth:`generate`,
        runs without a cache here); left-padded rows numbered from their first token, as GPT-2's generate does."""
        mask = kwargs.get("attention_mask")
        positions = None
        if mask is not None:
            positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
        return {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions}

    @torch.no_grad()
    def generate(self, inputs: Optional[Tensor] = None, generation_config: Optional[GenerationConfig] = None,
                 **options: Any) -> Any:
        """``transformers``' ``generate``: interlayer's decoding for the options it implements (module docstring),
        ``transformers``' loop without a cache for the others."""
        input_ids = inputs if inputs is not None else options.pop("input_ids", None)
        if input_ids is None:
            raise ValueError("generate needs input_ids (the prompts)")
        attention_mask = options.pop("attention_mask", None)
        merged = self.generation_config.to_diff_dict() if self.generation_config is not None else {}
        merged.update(generation_config.to_diff_dict() if generation_config is not None else {})
        try:
            out = generate_like_hf(self.interlayer, input_ids, generation_config=merged,
                                   padding_mask=None if attention_mask is None else attention_mask == 0, **options)
        except UnsupportedGenerationOption:
            options.pop("use_cache", None)
            return GenerationMixin.generate(self, input_ids, generation_config=generation_config,
                                            attention_mask=attention_mask, use_cache=False, **options)
        if isinstance(out, GenerateOutput):
            if out.sequences_scores is not None:
                return GenerateBeamDecoderOnlyOutput(sequences=out.sequences, sequences_scores=out.sequences_scores)
            return GenerateDecoderOnlyOutput(sequences=out.sequences)
        return out


CLASSES = (InterlayerModel, InterlayerForCausalLM, InterlayerForSequenceClassification,
           InterlayerForImageClassification)
