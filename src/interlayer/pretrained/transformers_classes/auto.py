"""``import interlayer`` makes ``transformers`` know interlayer models, when ``transformers`` is used.

``transformers`` finds a model class through its Auto classes: ``config.json``'s ``model_type`` names a config
class (``AutoConfig``), and that class a model class per task (``AutoModel``, ``AutoModelForCausalLM``, ...).
interlayer registers ``model_type: "interlayer"`` (:class:`~interlayer.pretrained.configuration.InterlayerConfig`)
and its four model classes (:mod:`~interlayer.pretrained.transformers_classes.modeling`), so that ``AutoModelForCausalLM
.from_pretrained(folder)``, ``AutoModelForSequenceClassification``, ``AutoModelForImageClassification``,
``AutoModel`` and ``pipeline(...)`` load an ``interlayer export`` of any method without ``trust_remote_code``.

**When**: importing ``transformers``' model machinery takes seconds, so ``import interlayer`` imports none of it.
It asks to be called back (:func:`interlayer.plugins.after_import`): when ``transformers``' ``configuration_auto``
is imported, :func:`register_config` registers the config class; the model classes are registered the first
time an :class:`InterlayerConfig` is made (:func:`register_models`, from the config's constructor: every way to
an interlayer model in ``transformers`` starts there, and by then ``transformers`` is imported); when
``transformers.trainer`` is imported, :func:`register_trainer_callback` adds :class:`OptimizerStepCallback` to
every ``Trainer``'s callbacks. Without ``transformers`` installed nothing happens. Nothing here runs code from a
model folder: the classes are interlayer's own.

**Trainer**: the methods whose counters follow the optimiser steps (Predictive Attention's
``alpha_warmup_steps``, value residuals' ``lambda_warmup_steps``) are advanced by interlayer's training engine
after each step (``optimizer_step_done``); :class:`OptimizerStepCallback` does the same in ``transformers.Trainer``
(``on_optimizer_step``), so a warm-up ramps there too and a checkpoint carries its counter. Without it the
counters would stay at 0 and the methods would never switch on.
"""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from ...checkpoint import model_kind
from ...models.registry import build_saved
from . import configuration


def register_config() -> None:
    """``AutoConfig``: ``model_type: "interlayer"``; the model classes follow on the first config made."""
    from transformers import AutoConfig

    AutoConfig.register(configuration.MODEL_TYPE, configuration.InterlayerConfig, exist_ok=True)
    if register_models not in configuration.ON_FIRST_USE:
        configuration.ON_FIRST_USE.append(register_models)


def register_models() -> None:
    """The four model classes with their Auto classes, and the registry as the builder of other families."""
    import transformers

    from . import modeling

    modeling.FALLBACK_BUILDER = lambda model_type, data: build_saved(model_type, data, "config.json")
    for model_class in modeling.CLASSES:
        getattr(transformers, model_class.auto_class).register(configuration.InterlayerConfig, model_class,
                                                                exist_ok=True)


def register_trainer_callback(trainer_module: Any) -> None:
    """:class:`OptimizerStepCallback` among ``transformers.Trainer``'s default callbacks (module docstring)."""
    defaults: list = trainer_module.DEFAULT_CALLBACKS
    if not any(getattr(c, "__name__", "") == "OptimizerStepCallback" for c in defaults):
        defaults.append(_callback_class())


def _callback_class() -> type:
    from transformers import TrainerCallback

    class OptimizerStepCallback(TrainerCallback):
        """After each optimiser step, ``optimizer_step_done()`` on every module that has it (what interlayer's
        engine does): the warm-up counters of Predictive Attention and value residuals."""

        def on_optimizer_step(self, args: Any, state: Any, control: Any, model: Optional[nn.Module] = None,
                              **kwargs: Any) -> None:
            if model is None:
                return
            for module in model.modules():
                step_done = getattr(module, "optimizer_step_done", None)
                if callable(step_done):
                    step_done()

    return OptimizerStepCallback


def to_transformers(model: nn.Module) -> Any:
    """The ``transformers`` class of ``model`` around it (the same module, not a copy): an
    ``InterlayerForCausalLM`` for a language model, ``...ForSequenceClassification`` for a text classifier,
    ``...ForImageClassification`` for an image classifier, ``InterlayerModel`` for another model. Its
    ``save_pretrained`` writes a folder ``AutoModel*`` loads; ``pipeline(task, model=it, tokenizer=...)`` and
    ``Trainer(model=it)`` take it."""
    register_config()
    register_models()
    from . import modeling

    kind = model_kind(model)
    chosen = next((c for c in modeling.CLASSES if kind in c.kinds), modeling.InterlayerModel)
    return chosen.from_interlayer(model)
