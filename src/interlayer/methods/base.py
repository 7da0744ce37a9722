"""How a method plugs into the core: a config section, a validation, and two hooks around model building.

``customize`` runs before the model is built and may replace factories on :class:`Components` (a different
attention module, a logit mixer, an encoder class). ``finalize`` runs on the built model and may tie parameters
or register auxiliary losses. Methods never edit core code, so any subset of them composes, and every pair that
cannot compose is rejected by ``validate`` with the reason.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

from ..core.components import Components

if TYPE_CHECKING:
    from ..config import ModelConfig


class Method(Protocol):
    name: str  # the section's key in ModelConfig
    config_class: type

    def validate(self, section: Any, cfg: "ModelConfig") -> None: ...

    def customize(self, section: Any, cfg: "ModelConfig", components: Components) -> None: ...

    def finalize(self, section: Any, cfg: "ModelConfig", model: nn.Module) -> None: ...


class MethodBase:
    """What most methods' hooks share: ``validate`` is the section's own ``validate(cfg)``, ``customize`` and
    ``finalize`` change nothing. A method subclasses it, sets ``name`` and ``config_class`` and overrides the hooks
    it needs (any object with those attributes and the three hooks is a :class:`Method` as well)."""

    name: str
    config_class: type

    def validate(self, section: Any, cfg: "ModelConfig") -> None:
        section.validate(cfg)

    def customize(self, section: Any, cfg: "ModelConfig", components: Components) -> None:
        """Nothing to replace before the build."""

    def finalize(self, section: Any, cfg: "ModelConfig", model: nn.Module) -> None:
        """Nothing to tie or add after the build."""
