"""The core Transformer as a family of the registry: ``ModelConfig`` in, :func:`~interlayer.build.build_model` out.

Its presets are the papers' configurations (:mod:`interlayer.papers`); a config dict or file without a
``model_type`` or an image ``backbone`` is read as one of these.
"""
from __future__ import annotations

from ..accounting import count_madds
from ..build import build_model
from ..config import ModelConfig, apply_overrides, config_from_dict
from .registry import Family, register_family

register_family(Family(
    name="transformer", title="Transformer presets", tasks="lm, translation, sst5, sst2, sick, mrpc",
    config_class=ModelConfig, from_dict=config_from_dict, override=apply_overrides, build=build_model,
    madds=lambda name, model, length: count_madds(model, length), madds_unit="MAdds @ {length} tokens", rank=0,
    model_types=("transformer",)))
