"""PLACEHOLDER: the helper implementing this method replaces this file."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PredictiveConfig:
    def validate(self, cfg) -> None:
        pass


class _PredictiveMethod:
    name = "predictive"
    config_class = PredictiveConfig

    def validate(self, section, cfg) -> None:
        section.validate(cfg)

    def customize(self, section, cfg, components) -> None:
        pass

    def finalize(self, section, cfg, model) -> None:
        pass


METHOD = _PredictiveMethod()
