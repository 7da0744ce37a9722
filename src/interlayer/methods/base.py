"""How a method plugs into the core: a config section, a validation, and two hooks around model building.

``customize`` runs before the model is built and may replace factories on :class:`Components` (a different
attention module, a logit mixer, an encoder class). ``finalize`` runs on the built model and may tie parameters
or register auxiliary losses. Methods never edit core code, so any subset of them composes, and every pair that
cannot compose is rejected by ``validate`` with the reason.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Protocol, Sequence

from torch import nn

from ..core.components import Components
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config import ModelConfig


# The stacks a method with a ``sides`` option may apply to: the encoder (a causal LM's stack is its encoder) and the
# decoder of an encoder-decoder.
StackSide = Literal["encoder", "decoder"]


class Method(Protocol):
    name: str  # the section's key in ModelConfig
    config_class: type
    # True when the method only ties parameters (and may add training losses): the forward computation is the plain
    # model's, so a model using it can be written out in a format that stores every weight separately (to_hf).
    ties_only: bool

    def validate(self, section: Any, cfg: "ModelConfig") -> None: ...

    def customize(self, section: Any, cfg: "ModelConfig", components: Components) -> None: ...

    def finalize(self, section: Any, cfg: "ModelConfig", model: nn.Module) -> None: ...


def check_core_self_attention(cfg: "ModelConfig", key: str, sides: list[str]) -> None:
    """Refuse, naming ``key``, the methods that replace the core self-attention of ``sides``: a method that feeds
    keys/values through its ``kv_source`` slot (value_residual, cla) needs the core module."""
    if cfg.lightweight is not None and cfg.lightweight.replaces_attention:
        raise ConfigError(f"{key} feeds earlier layers' keys/values into the core self-attention, but "
                          "lightweight.attention / group_merge / qk_expansion replace it with group-wise attention, "
                          "whose grouped projections this does not reach; keep only G-FFN (lightweight.attention="
                          f"false, group_merge=false, qk_expansion=1) or remove the {key} section")
    if cfg.conv_branch is not None and set(cfg.conv_branch.sides) & set(sides):
        raise ConfigError(f"{key} feeds earlier layers' keys/values into the core self-attention, but conv_branch "
                          f"replaces the self-attention of sides {list(cfg.conv_branch.sides)} with its attention + "
                          f"convolution block; remove one of the conv_branch and {key} sections")
class MethodBase:
    """What most methods' hooks share: ``validate`` is the section's own ``validate(cfg)``, ``customize`` and
    ``finalize`` change nothing. A method subclasses it, sets ``name`` and ``config_class`` and overrides the hooks
    it needs (any object with those attributes and the three hooks is a :class:`Method` as well)."""

    name: str
    config_class: type
    ties_only: bool = False

    def validate(self, section: Any, cfg: "ModelConfig") -> None:
        section.validate(cfg)

    def customize(self, section: Any, cfg: "ModelConfig", components: Components) -> None:
        """Nothing to replace before the build."""

    def finalize(self, section: Any, cfg: "ModelConfig", model: nn.Module) -> None:
        """Nothing to tie or add after the build."""


def stack_sides(key: str, sides: Optional[Sequence[str]], cfg: "ModelConfig") -> list[str]:
    """The stacks a method's ``sides`` option names, checked (``key`` is the section, for the error): ``None`` is
    every stack the model has, an explicit list names each of ``encoder`` / ``decoder`` at most once and only
    those the architecture has."""
    if sides is None:
        return ["encoder", "decoder"] if cfg.arch == "encoder_decoder" else ["encoder"]
    if (not isinstance(sides, (list, tuple)) or not sides or len(set(sides)) != len(sides)
            or not set(sides) <= {"encoder", "decoder"}):
        raise ConfigError(f"{key}.sides={sides!r} must list 'encoder' and/or 'decoder' once each, or be null for "
                          "every stack of the model")
    if cfg.arch != "encoder_decoder" and "decoder" in sides:
        raise ConfigError(f"{key}.sides={list(sides)} includes 'decoder', but arch={cfg.arch!r} has no decoder (a "
                          "causal LM's stack is 'encoder'); use sides=['encoder']")
    return list(sides)


def add_kv_sources(components: Components, sides: Sequence[str], source: Callable[[int], Optional[nn.Module]]
                   ) -> None:
    """Give layer ``i`` of the stacks in ``sides`` the K/V source ``source(i)``
    (:class:`~interlayer.core.attention.KVSource`); where it returns None, and in other stacks, the layer keeps the
    source it had (another method's, or none)."""
    previous = components.kv_source

    def factory(side: str, index: int) -> Optional[nn.Module]:
        made = source(index) if side in sides else None
        return made if made is not None else previous(side, index)

    components.kv_source = factory
