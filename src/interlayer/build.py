"""Turn a :class:`ModelConfig` into a model: validate, let each method customise the factories, build, finalise."""
from __future__ import annotations

from torch import nn

from .config import ModelConfig
from .core.components import Components
from .core.models import EncoderClassifier, EncoderDecoderModel


def build_model(cfg: ModelConfig) -> nn.Module:
    cfg.validate()
    components = Components(cfg)
    for method, section in cfg.sections():
        method.customize(section, cfg, components)
    if cfg.arch == "encoder_decoder":
        model: nn.Module = EncoderDecoderModel(cfg, components)
    else:
        model = EncoderClassifier(cfg, components)
    for method, section in cfg.sections():
        method.finalize(section, cfg, model)
    model.config = cfg
    return model
