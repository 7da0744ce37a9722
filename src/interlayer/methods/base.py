"""How a method plugs into the core, and what it tells the rest of the package about itself.

Plugging in: a config section, a validation, and two hooks around model building. ``customize`` runs before the
model is built and may replace factories on :class:`Components` (a different attention module, a logit mixer, an
encoder class). ``finalize`` runs on the built model and may tie parameters or register auxiliary losses. Methods
never edit core code, so any subset of them composes, and every pair that cannot compose is rejected by
``validate`` with the reason.

What a method registers where it lives, so that adding one is a module here plus its docs page and test file
(docs/architecture.md, "Adding a method"):

* its config section (``name``, ``config_class``): :class:`~interlayer.config.ModelConfig` has one field per
  method, made from :data:`~interlayer.methods.METHODS`;
* its named ``compare`` variants (``variants``: :class:`NamedVariant` by name), which ``compare --variants``
  offers beside the baseline;
* its composition facts: ``examples`` (small sections that ``tests/test_composition.py`` builds beside every
  other method's) and ``conflicts`` (the methods it refuses to compose with, and words of the reason);
* its language-model examples (``lm_examples``: the sections that make a tiny causal language model with it, which
  the tests of decoding, caching and the ``transformers`` surface run for every method; none where the method has
  no causal form);
* what an import of a pretrained checkpoint must know of it (:mod:`interlayer.pretrained`): whether a section
  ``restructures`` the checkpoint's weights (replaces, deletes or ties matrices the checkpoint holds, so the import
  needs ``reinitialise``), and the option that makes it start exactly as the imported model (``exact_start``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol, Sequence

from torch import nn

from ..config_io import MethodSlots, SectionForm
from ..core.components import Components
from ..core.config import TransformerConfig
from ..errors import ConfigError, VariantError


class ComposedConfig(TransformerConfig):
    """The configuration a method's hooks receive: :class:`interlayer.config.ModelConfig`, the core's fields plus
    one section per method under the method's name (``None`` when off).

    ModelConfig is composed from the methods, one layer above them, so a method never imports it, not even for type
    checking (the package has no import circle at any level). ModelConfig derives from this class, and to a type
    checker it says what a method may read: the core's fields, typed, and any other attribute (another method's
    section) as ``Any``."""

    if TYPE_CHECKING:  # for type checkers only: at run time an unknown attribute raises as on any object
        def __getattr__(self, name: str) -> Any: ...


# -- compare variants ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VariantContext:
    """What a named variant may depend on: the task, the comparison's base preset, its resolved config (a dict),
    where that model takes method sections (its family's :class:`MethodSlots`), and ``task_settings``: dotted model
    settings the papers fix for this task (PA's alpha on SICK), which compare finds in the papers' modules
    (:func:`interlayer.papers.task_settings`), so that a method names no task."""

    task: str
    preset: str
    base: dict[str, Any]
    slots: MethodSlots = MethodSlots()
    task_settings: Mapping[str, Any] = field(default_factory=dict)

    def settings_of(self, method: str) -> dict[str, Any]:
        """The :attr:`task_settings` of ``method``'s section (``predictive.alpha`` for ``predictive``)."""
        return {key: value for key, value in self.task_settings.items() if key.split(".")[0] == method}

    def excludes(self, method: str) -> bool:
        """Whether the model takes some methods' sections but not ``method``'s (a variant refuses it by name)."""
        return self.slots.only is not None and method not in self.slots.only

    def form(self, method: str) -> Optional[SectionForm]:
        """The form of its own the model gives ``method``'s section, or None (a Transformer section)."""
        return self.slots.forms.get(method)

    def transformer_fields(self, method: str) -> dict[str, Any]:
        """The fields a method section's keys go beside: the config itself, or its nested Transformer config (a
        vision model's ``encoder``, a region model's ``transformer``), as the model's slots say. Raises
        :class:`VariantError` naming ``method`` for a model without them."""
        at = self.slots.at
        if at == "":
            return self.base
        if at is not None and isinstance(self.base.get(at), dict):
            return self.base[at]
        kind = self.base.get("model_type", "non-Transformer")
        raise VariantError(f"the {method} variants add a method section to a Transformer, but task {self.task!r} "
                           f"trains a {kind} model (preset {self.preset!r}) that has none; compare that model's own "
                           "presets instead")


@dataclass(frozen=True)
class NamedVariant:
    """A ``compare --variants`` name: what it is (with the paper's section or table) and the model overrides it
    gives the base preset, dotted keys (``{"crossformer.hard": ["kq"]}``) or whole sections."""

    description: str
    overrides: Callable[[VariantContext], dict[str, Any]]


def section_variant(method: str, label: str, refusal: str, *, whole: bool = False, **section: Any
                    ) -> Callable[[VariantContext], dict[str, Any]]:
    """The overrides of a variant that turns on ``method``'s section on the Transformer's stacks: ``section`` whole
    (``whole``), or its keys as dotted overrides (none: the section with its defaults). ``label`` names the method
    in errors; a model that takes other methods' sections but not this one's is refused with ``refusal``
    (``{model}``, ``{task}`` and ``{preset}`` are filled)."""

    def overrides(ctx: VariantContext) -> dict[str, Any]:
        if ctx.excludes(method):
            raise VariantError(refusal.format(model=ctx.slots.name, task=repr(ctx.task), preset=repr(ctx.preset)))
        ctx.transformer_fields(label)
        if whole:
            return {method: dict(section)}
        return {f"{method}.{key}": value for key, value in section.items()} if section else {method: {}}

    return overrides


# What the methods that replace the residual path say of a model whose stacks are not the core's (MCAN)
STACK_REFUSAL = "{label} has no {{model}} form here: {{model}}'s stacks run their own loops"
# What the methods that feed keys/values across layers say of it
KV_REFUSAL = ("the {label} variants change the core Transformer's self-attention stacks; task {{task}} trains "
              "{{model}} (preset {{preset}}), whose config has no such section")


# -- composition facts --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompositionExample:
    """A small section of the method that ``tests/test_composition.py`` builds beside every other method's example,
    in an encoder-decoder and in a classifier: one training step, finite gradients, MAdds equal to the FLOP counter.
    ``name`` is the example's name in the test (the method's name, or the method's name and a suffix); ``core``
    holds the core fields the section needs (``norm_first=True`` for the pre-LN-only hyper-connections)."""

    name: str
    section: dict[str, Any] = field(default_factory=dict)
    core: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Conflict:
    """A combination the method refuses: with ``other`` (another method's :class:`CompositionExample`, by name) every
    example of this method is rejected with a :class:`ConfigError` containing ``reason``."""

    other: str
    reason: str


class Method(Protocol):
    """What the package reads of a method (module docstring): its section (``name``, ``config_class``), its compare
    variants, its composition facts, its language-model examples, what an import of a checkpoint must know of it,
    and the three hooks around model building."""

    name: str  # the section's key in ModelConfig
    config_class: type
    # True when the method only ties parameters (and may add training losses): the forward computation is the plain
    # model's, so a model using it can be written out in a format that stores every weight separately (to_hf).
    ties_only: bool
    variants: Mapping[str, NamedVariant]
    examples: tuple[CompositionExample, ...]
    conflicts: tuple[Conflict, ...]
    # example name (unique over all methods) -> a section of the method that a tiny causal LM runs; empty: the method
    # has no causal form (its validate refuses arch="causal_lm")
    lm_examples: Mapping[str, Mapping[str, Any]]

    def restructures(self, section: Any) -> bool:
        """Whether ``section`` replaces, deletes or ties weights a pretrained checkpoint holds (its tensors have no
        place in the model, or two different ones would land in one tied parameter), so an import needs
        ``reinitialise``; a section that only adds parameters does not."""

    def exact_start(self, section: Any) -> Optional[str]:
        """The option of ``section`` (a key of the section) that makes it start as the imported model computes and
        ramps it in, where it has one; None otherwise."""

    def validate(self, section: Any, cfg: ComposedConfig) -> None: ...

    def customize(self, section: Any, cfg: ComposedConfig, components: Components) -> None: ...

    def finalize(self, section: Any, cfg: ComposedConfig, model: nn.Module) -> None: ...


class MethodBase:
    """What most methods' hooks share: ``validate`` is the section's own ``validate(cfg)``, ``customize`` and
    ``finalize`` change nothing, no section restructures a checkpoint or has an exact start. A method subclasses it,
    sets ``name``, ``config_class``, ``variants``, ``examples``, ``conflicts`` and ``lm_examples`` (no default: a
    method says whether it has a causal form) and overrides the hooks it needs (any object with those attributes and
    the hooks is a :class:`Method` as well)."""

    name: str
    config_class: type
    ties_only: bool = False
    variants: Mapping[str, NamedVariant] = {}
    examples: tuple[CompositionExample, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    lm_examples: Mapping[str, Mapping[str, Any]]

    def restructures(self, section: Any) -> bool:
        """Only adds parameters: the checkpoint's tensors load as they are."""
        return False

    def exact_start(self, section: Any) -> Optional[str]:
        """No option starts it exactly."""
        return None

    def validate(self, section: Any, cfg: ComposedConfig) -> None:
        section.validate(cfg)

    def customize(self, section: Any, cfg: ComposedConfig, components: Components) -> None:
        """Nothing to replace before the build."""

    def finalize(self, section: Any, cfg: ComposedConfig, model: nn.Module) -> None:
        """Nothing to tie or add after the build."""


# -- helpers the methods share ------------------------------------------------------------------------------------
# The most a method's multiplier of a step's activations or time may be (hyper-connections' and mHC's rate,
# Multi-Pass's passes, LW's query/key expansion): the papers use at most 8, and a typo (rate=400) would fill the
# device's memory, or run for days, before any message
MAX_MULTIPLIER = 64


def check_at_most(key: str, value: int, limit: int, what: str) -> None:
    """Refuse ``value`` of option ``key`` above ``limit`` (:class:`ConfigError` saying ``what`` it multiplies)."""
    if value > limit:
        raise ConfigError(f"{key}={value} is more than {limit:,}, the most interlayer allows: {what}; a typo?")


def stack_sides(key: str, sides: Optional[Sequence[str]], cfg: ComposedConfig, *,
                decoder_refused: Optional[str] = None) -> list[str]:
    """The stacks a method's ``sides`` option names, checked (``key`` is the section, for the error): ``None`` is
    every stack the model has, an explicit list names each of ``encoder`` / ``decoder`` at most once and only
    those the architecture has. ``decoder_refused``: why the method cannot run in this model's decoder (checked
    before the architecture, as the more useful message)."""
    if sides is None:
        chosen = ["encoder", "decoder"] if cfg.arch == "encoder_decoder" else ["encoder"]
    elif (not isinstance(sides, (list, tuple)) or not sides or len(set(sides)) != len(sides)
            or not set(sides) <= {"encoder", "decoder"}):
        raise ConfigError(f"{key}.sides={sides!r} must list 'encoder' and/or 'decoder' once each, or be null for "
                          "every stack of the model")
    else:
        chosen = list(sides)
    if decoder_refused is not None and "decoder" in chosen:
        raise ConfigError(f"{key}.sides={sides!r}: 'decoder' is not supported: {decoder_refused}. Use "
                          f"{key}.sides=['encoder']")
    if cfg.arch != "encoder_decoder" and "decoder" in chosen:
        raise ConfigError(f"{key}.sides={list(chosen)} includes 'decoder', but arch={cfg.arch!r} has no decoder (a "
                          "causal LM's stack is 'encoder'); use sides=['encoder']")
    return chosen


def check_core_self_attention(cfg: ComposedConfig, key: str, sides: list[str]) -> None:
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
