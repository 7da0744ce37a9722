"""Turn a :class:`ModelConfig` into a model: validate, let each method customise the factories, build, finalise."""
from __future__ import annotations

from typing import Callable, Optional

from torch import nn

from .config import ModelConfig
from .core.components import Components
from .core.lm import CausalLM
from .core.models import EncoderClassifier, EncoderDecoderModel


def customized_components(cfg: ModelConfig, base: Optional[Callable[[Components], None]] = None) -> Components:
    """``cfg`` validated and its factories as the methods leave them: what :func:`build_model` builds from, and what
    a backbone that assembles its own stacks (Swin's stages, AA-ResNet's blocks) takes its layers from, so the
    methods reach them through their public sections."""
    cfg.validate()
    components = Components(cfg)
    if base is not None:
        base(components)
    for method, section in cfg.sections():
        method.customize(section, cfg, components)
    return components


def build_model(cfg: ModelConfig, *, with_tokens: bool = True,
                base: Optional[Callable[[Components], None]] = None) -> nn.Module:
    """Build the model ``cfg`` describes.

    ``with_tokens=False`` builds a classifier without a token table (it reads ``inputs_embeds``: image patches,
    feature maps); ``base`` may replace the core's factories before the methods customise them (a baseline that
    swaps attention for convolution, say), so the methods still apply on top.
    """
    components = customized_components(cfg, base)
    if cfg.arch == "encoder_decoder":
        model: nn.Module = EncoderDecoderModel(cfg, components)
    elif cfg.arch == "causal_lm":
        model = CausalLM(cfg, components)
    else:
        model = EncoderClassifier(cfg, components, with_tokens=with_tokens)
    for method, section in cfg.sections():
        method.finalize(section, cfg, model)
    model.config = cfg
    return model
