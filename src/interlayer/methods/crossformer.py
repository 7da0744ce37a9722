"""Crossformer: alternated cross-layer guidance (Crossformer paper, Sec. 2; Tables 1-3 and 6). Every reading below is
argued, with its tests, in docs/methods/crossformer.md.

Paper map:

* **Soft guidance, SG** (Sec. 2.1, Eq. 1-2): ``L = L_nll + alpha * L_reg``, ``L_reg = sum_{t<T} ||A(t) -
  sg(B(t+1))||``: higher layers guide lower ones (the upper side's gradient stopped). ``soft`` lists the pairs; the
  term is ``model.aux_loss_fns["crossformer_sg"]`` (:class:`SoftGuidance`, :class:`StateGuidance`), alpha inside.
* **Hard guidance, HG** (Sec. 2.2): ``A(t) = B(t+1)`` made exact by weight tying (:func:`tie`); ``hard`` lists the
  pairs.
* **Pairs**: ``kq`` (Eq. 3, the default), Table 6's other orders ``qk``, ``qq``, ``kk``; ``vf`` (Eq. 6: W_F at odd
  t, W_V at even t); ``ffn`` (Eq. 5: W_2 at odd t, W_1 at even t; ``ffn_order`` swaps them). Key-Query, Value,
  FFN and All of Tables 1-3 name these.

Readings where the paper is ambiguous: Eq. 3 is weight tying (``K(t) = H(t) W_Q(t+1)``; read literally it is
circular); SG compares weights by default and the matrices' outputs with ``soft_target="states"``; an attention
label "X-Y" of Table 6 holds for every t (so ``qq``/``kk`` chain through the stack), an FFN label names the matrix
tied at odd t first; odd depths tie each adjacent pair once (T-1 ties, :func:`hard_savings`); biases follow their
weights (``include_bias``); the L1/L2 regulariser is a sum of powers by default (``sg_norm``, ``reduction``);
``sides`` picks the stacks, ``"cross"`` adds the decoder's cross-attention, which Tables 1-3's counts need.
Every pair needs the plain projections, so the methods that replace a guided module are refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, NamedTuple, Optional, get_args

import torch
from torch import Tensor, nn

from ..core.attention import MultiHeadAttention
from ..core.components import Components
from ..core.feedforward import FeedForward
from ..core.recording import StateRecorder, record_forward
from ..errors import ConfigError, VariantError
from .base import ComposedConfig, CompositionExample, Conflict, MethodBase, NamedVariant, VariantContext

Pair = Literal["kq", "qk", "qq", "kk", "vf", "ffn"]
# the stacks guidance may reach: self-attention+FFN stacks, and the decoder's cross-attention
GuidedStack = Literal["encoder", "decoder", "cross"]
SoftTarget = Literal["weights", "states"]
FFNOrder = Literal["w2_w1", "w1_w2"]
SGNorm = Literal["power", "root"]
Reduction = Literal["sum", "mean"]

# Attention order "X-Y" (Eq. 3 / Table 6): the projection of layer t (lower) and of layer t+1 (upper) tied.
ATTENTION_ORDERS: dict[str, tuple[str, str]] = {"kq": ("k_proj", "q_proj"), "qk": ("q_proj", "k_proj"),
                                                "qq": ("q_proj", "q_proj"), "kk": ("k_proj", "k_proj")}
# Alternated pairs: (matrix shared between t and t+1 for odd t, for even t), t counted from 1 as in Eq. 5-6.
ALTERNATIONS: dict[str, tuple[str, str]] = {"vf": ("out_proj", "v_proj"), "w2_w1": ("fc2", "fc1"),
                                            "w1_w2": ("fc1", "fc2")}
PAIRS: tuple[str, ...] = get_args(Pair)
SIDES: tuple[str, ...] = get_args(GuidedStack)
# Projections a MultiHeadAttention applies to its input; fused self-attention computes them in one product, so
# their states are read from the attention's input (StateGuidance), not from a call of the nn.Linear itself.
_PROJECTIONS = ("q_proj", "k_proj", "v_proj")
_FACTORIES = ("self_attention", "cross_attention", "ffn")


@dataclass
class CrossformerConfig:
    """Which cross-layer pairs are hard-tied (Sec. 2.2) or soft-guided (Eq. 1-2), and where.

    ``hard``/``soft``: pairs from ``kq``, ``qk``, ``qq``, ``kk`` (attention orders, Table 6), ``vf`` (Eq. 6) and
    ``ffn`` (Eq. 5); at least one pair in total, at most one attention order in ``hard``, no pair in both.
    ``sides``: ``encoder``/``decoder`` self-attention+FFN stacks, ``cross`` (decoder cross-attention); ``None``
    means every self-attention stack of the model. ``p``, ``alpha``, ``sg_norm``, ``reduction`` shape SG's
    regulariser (alpha 0.01: Appendix A.1.2); ``soft_target`` says what it compares: the matrices (``weights``) or
    their outputs in the forward pass (``states``, Eq. 1 read literally). docs/methods/crossformer.md argues every
    reading and its reason.
    """

    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset()  # no option sizes a saved tensor (checkpoint.py)

    hard: list[Pair] = field(default_factory=list)
    soft: list[Pair] = field(default_factory=list)
    ffn_order: FFNOrder = "w2_w1"
    sides: Optional[list[GuidedStack]] = None
    include_bias: bool = True
    p: int = 2
    alpha: float = 0.01
    sg_norm: SGNorm = "power"
    reduction: Reduction = "sum"
    soft_target: SoftTarget = "weights"

    def resolved_sides(self, cfg: ComposedConfig) -> list[str]:
        """The guided stacks: ``sides``, or every self-attention stack the architecture has."""
        if self.sides is not None:
            return list(self.sides)
        return ["encoder", "decoder"] if cfg.arch == "encoder_decoder" else ["encoder"]

    def validate(self, cfg: ComposedConfig) -> None:
        _check_unique("crossformer.hard", self.hard)
        _check_unique("crossformer.soft", self.soft)
        if not self.hard and not self.soft:
            raise ConfigError("crossformer needs at least one pair in crossformer.hard or crossformer.soft, got "
                              f"none; choose from {', '.join(map(repr, PAIRS))} (e.g. hard=['kq', 'vf', 'ffn'] "
                              "is Crossformer-All)")
        orders = [pair for pair in self.hard if pair in ATTENTION_ORDERS]
        if len(orders) > 1:
            raise ConfigError(f"crossformer.hard={self.hard} names {len(orders)} attention orders {orders}; keep "
                              "one (Table 6 compares them one at a time; two would merge every layer's q/k into "
                              "two shared matrices)")
        both = [pair for pair in self.soft if pair in self.hard]
        if both:
            raise ConfigError(f"crossformer.soft={self.soft} repeats {both} from crossformer.hard: a tied pair is "
                              "one tensor, so its soft-guidance term is identically zero; drop it from one list")
        if self.p not in (1, 2) or isinstance(self.p, bool):
            raise ConfigError(f"crossformer.p={self.p!r} is not valid; choose 1 (L1) or 2 (L2)")
        if not self.alpha >= 0.0 or math.isinf(self.alpha):
            raise ConfigError(f"crossformer.alpha={self.alpha!r} must be a finite number >= 0 (the paper uses 0.01)")
        self._validate_sides(cfg)
        self._validate_states(cfg)
        _check_composition(self, cfg)

    def _validate_states(self, cfg: ComposedConfig) -> None:
        """Refuse what ``soft_target="states"`` cannot compare, or what it would silently ignore."""
        if self.soft_target != "states":
            return
        if not self.soft:
            raise ConfigError("crossformer.soft_target='states' chooses what soft guidance compares, but "
                              "crossformer.soft is empty; add a pair to soft or leave soft_target='weights'")
        if not self.include_bias and not self.hard:
            raise ConfigError("crossformer.include_bias=False does nothing with soft_target='states' and no hard "
                              "pairs: a state is the nn.Linear's output, bias included; leave include_bias=True")
        crossed = [pair for pair in self.soft if pair in ("kq", "qk")]
        if crossed and "cross" in self.resolved_sides(cfg):
            raise ConfigError(f"crossformer.soft={self.soft} with soft_target='states' and 'cross' in "
                              f"crossformer.sides compares cross-attention keys, one per source position, with "
                              f"queries, one per target position, via {crossed}; they have no common positions. "
                              "Use 'qq'/'kk'/'vf' on the cross side, or soft_target='weights'")

    def _validate_sides(self, cfg: ComposedConfig) -> None:
        if self.sides is not None:
            _check_unique("crossformer.sides", self.sides)
            if not self.sides:
                raise ConfigError(f"crossformer.sides is empty; choose from {', '.join(map(repr, SIDES))} or "
                                  "leave it unset for every self-attention stack")
            no_decoder = [side for side in self.sides if side != "encoder"]
            if cfg.arch != "encoder_decoder" and no_decoder:
                raise ConfigError(f"crossformer.sides={self.sides} includes {no_decoder}, but arch={cfg.arch!r} "
                                  "has no decoder; use sides=['encoder']")
        sides = self.resolved_sides(cfg)
        for side in sides:
            key, layers = ("enc_layers", cfg.enc_layers) if side == "encoder" else ("dec_layers", cfg.dec_layers)
            if layers < 2:
                raise ConfigError(f"crossformer guides layer t with layer t+1, so every guided stack needs at "
                                  f"least 2 layers, but {key}={layers} (crossformer.sides includes {side!r})")
        for key, pairs in (("crossformer.hard", self.hard), ("crossformer.soft", self.soft)):
            if "ffn" in pairs and not any(side != "cross" for side in sides):
                raise ConfigError(f"{key} includes 'ffn', but crossformer.sides={sides} has no FFN stack (the "
                                  "cross-attention stack has none); add 'encoder' or 'decoder' to sides")


class Link(NamedTuple):
    """One guided pair: ``lower`` (layer t, the guided Linear) and ``upper`` (layer t+1, the guide), their module
    paths in the model and the guided ``side`` they belong to."""

    lower: nn.Module
    upper: nn.Module
    lower_path: str
    upper_path: str
    side: str

    @property
    def name(self) -> str:
        return f"{self.lower_path} <- {self.upper_path}"


BlocksOf = Callable[[str, str], tuple[list[nn.Module], str]]


def stack_links(pair: str, ffn_order: str, blocks: list[nn.Module], path: str, side: str) -> list[Link]:
    """The links of one stack, bottom to top; ``blocks[i]`` is layer i's attention (or FFN for ``ffn``)."""
    links = []
    for i in range(len(blocks) - 1):
        lower_attr, upper_attr = _attributes(pair, ffn_order, i)
        links.append(Link(getattr(blocks[i], lower_attr), getattr(blocks[i + 1], upper_attr),
                          f"{path.format(i)}.{lower_attr}", f"{path.format(i + 1)}.{upper_attr}", side))
    return links


def _attributes(pair: str, ffn_order: str, i: int) -> tuple[str, str]:
    if pair in ATTENTION_ORDERS:
        return ATTENTION_ORDERS[pair]
    odd_t, even_t = ALTERNATIONS["vf" if pair == "vf" else ffn_order]
    name = odd_t if i % 2 == 0 else even_t  # 0-based lower index i is the paper's t = i + 1
    return name, name


def collect_links(section: CrossformerConfig, cfg: ComposedConfig, pairs: list[str], key: str,
                  blocks_of: BlocksOf, owners: Optional[dict[str, str]] = None) -> list[Link]:
    """Every link of ``pairs`` on the guided sides, after checking the modules can be tied/regularised."""
    links: list[Link] = []
    for side in section.resolved_sides(cfg):
        for pair in pairs:
            if pair == "ffn" and side == "cross":
                continue
            blocks, path = blocks_of(side, pair)
            _check_blocks(blocks, pair, side, key, owners or {})
            for link in stack_links(pair, section.ffn_order, blocks, path, side):
                _check_link(link, key)
                links.append(link)
    return links


def model_blocks(model: nn.Module) -> BlocksOf:
    """``blocks_of`` reading a built model's stacks (``encoder.layers``, ``decoder.layers``)."""
    def blocks_of(side: str, pair: str) -> tuple[list[nn.Module], str]:
        stack = "encoder" if side == "encoder" else "decoder"
        attr = "ffn" if pair == "ffn" else ("cross_attn" if side == "cross" else "self_attn")
        layers = getattr(model, stack).layers
        return [getattr(layer, attr) for layer in layers], f"{stack}.layers.{{}}.{attr}"
    return blocks_of


def _factory_blocks(components: Components, cfg: ComposedConfig) -> BlocksOf:
    """``blocks_of`` calling the installed factories, as the model builder will."""
    def blocks_of(side: str, pair: str) -> tuple[list[nn.Module], str]:
        stack = "encoder" if side == "encoder" else "decoder"
        n_layers = cfg.enc_layers if stack == "encoder" else cfg.dec_layers
        if pair == "ffn":
            return [components.ffn(stack, i) for i in range(n_layers)], f"{stack}.layers.{{}}.ffn"
        if side == "cross":
            return [components.cross_attention(i) for i in range(n_layers)], "decoder.layers.{}.cross_attn"
        return [components.self_attention(stack, i) for i in range(n_layers)], f"{stack}.layers.{{}}.self_attn"
    return blocks_of


def _check_composition(section: CrossformerConfig, cfg: ComposedConfig) -> None:
    """Build the guided modules from the other methods' factories on the meta device and check them.

    Probing the factories (instead of reading other sections' fields) rejects exactly the combinations whose
    modules lack the plain projections, whatever option of the other method caused it, and names that method.
    It runs only when another method replaced a factory, on the meta device, so nothing is allocated (a few
    milliseconds per layer).
    """
    components = Components(cfg)
    owners: dict[str, str] = {}
    for method, other in cfg.sections():
        if method.name == "crossformer":
            continue
        before = {name: getattr(components, name) for name in _FACTORIES}
        method.customize(other, cfg, components)
        owners.update({name: method.name for name in _FACTORIES if getattr(components, name) is not before[name]})
    if not owners:
        return  # the core's own factories build plain MultiHeadAttention / FeedForward modules
    with torch.device("meta"):
        for key, pairs in (("crossformer.hard", section.hard), ("crossformer.soft", section.soft)):
            collect_links(section, cfg, list(pairs), key, _factory_blocks(components, cfg), owners)


def _check_blocks(blocks: list[nn.Module], pair: str, side: str, key: str, owners: dict[str, str]) -> None:
    """Every block must be the core module with plain ``nn.Linear`` projections for the matrices ``pair`` uses."""
    expected = FeedForward if pair == "ffn" else MultiHeadAttention
    factory = "ffn" if pair == "ffn" else ("cross_attention" if side == "cross" else "self_attention")
    names = sorted({name for i in range(2) for name in _attributes(pair, "w2_w1", i)})
    for i, block in enumerate(blocks):
        odd = [name for name in names if not isinstance(getattr(block, name, None), nn.Linear)]
        if isinstance(block, expected) and not odd:
            continue
        owner = owners.get(factory)
        by = f"the {owner} section replaces" if owner else "this model replaces"
        what = (f"whose {odd[0]} is a {type(getattr(block, odd[0], None)).__name__}" if isinstance(block, expected)
                else f"which is not a {expected.__name__}")
        raise ConfigError(
            f"{key} includes {pair!r}, which ties or regularises the plain nn.Linear {'/'.join(names)} of adjacent "
            f"{side} layers, but {by} layer {i}'s {'feed-forward' if pair == 'ffn' else 'attention'} module with "
            f"{type(block).__name__}, {what}; drop {pair!r} from {key}, or turn off the option of "
            f"{owner or 'the model'} that replaces that module")


def _check_link(link: Link, key: str) -> None:
    lower, upper = link.lower, link.upper
    if not (isinstance(lower, nn.Linear) and isinstance(upper, nn.Linear)):
        raise ConfigError(f"{key}: cannot guide {link.name}: both must be nn.Linear, got "
                          f"{type(lower).__name__} and {type(upper).__name__}")
    if lower.weight.shape != upper.weight.shape or (lower.bias is None) != (upper.bias is None):
        raise ConfigError(f"{key}: cannot guide {link.name}: weight shapes {tuple(lower.weight.shape)} and "
                          f"{tuple(upper.weight.shape)} (bias {lower.bias is not None} and "
                          f"{upper.bias is not None}) differ")


def tie(link: Link, include_bias: bool) -> None:
    """Make layer t's Linear use layer t+1's parameters (HG, ``A(t) = B(t+1)``)."""
    link.lower.weight = link.upper.weight
    if include_bias and link.upper.bias is not None:
        link.lower.bias = link.upper.bias


def guidance_distance(link: Link, p: int, norm: str, reduction: str, include_bias: bool) -> Tensor:
    """One term of Eq. 1 on weights: the p-distance between layer t's ``[W | b]`` and the stop-gradient of layer
    t+1's."""
    parts = [(link.lower.weight - link.upper.weight.detach()).flatten()]
    if include_bias and link.lower.bias is not None:
        parts.append(link.lower.bias - link.upper.bias.detach())
    return reduce_distance(torch.cat(parts), p, norm, reduction)


def reduce_distance(diff: Tensor, p: int, norm: str, reduction: str, count: Optional[Tensor] = None) -> Tensor:
    """``L_n-norm(A, sg(B))`` of Eq. 1 from the flattened difference ``diff``: ``sum |d|^p`` (``norm="power"``) or
    its p-th root ``||d||_p`` (``"root"``), divided for ``reduction="mean"`` by the number of entries compared,
    ``count`` (masked entries of ``diff`` are zeros and not counted), or by ``diff.numel()`` when None.

    ``torch.linalg.vector_norm`` is used for the root so its gradient at zero distance is 0, not NaN.
    """
    if norm == "root":
        distance = torch.linalg.vector_norm(diff, ord=p)
        if reduction == "sum":
            return distance
        return distance / (diff.numel() if count is None else count) ** (1.0 / p)
    powered = diff.abs() if p == 1 else diff.pow(2)
    if reduction == "sum":
        return powered.sum()
    return powered.mean() if count is None else powered.sum() / count


class SoftGuidance:
    """``alpha * L_reg`` of Eq. 1-2 on weights (``soft_target="weights"``), as a picklable aux-loss function.

    The links are re-read from the model on every call, so modules replaced after building are respected.
    """

    def __init__(self, section: CrossformerConfig, cfg: ComposedConfig) -> None:
        self.section = section
        self.cfg = cfg

    def __call__(self, model: nn.Module) -> Tensor:
        s = self.section
        links = collect_links(s, self.cfg, list(s.soft), "crossformer.soft", model_blocks(model))
        terms = [guidance_distance(link, s.p, s.sg_norm, s.reduction, s.include_bias) for link in links]
        return s.alpha * torch.stack(terms).sum()


class StateSite(NamedTuple):
    """One state term: the guided site (layer t), its guide (layer t+1) and whose positions their rows are."""

    lower: str
    upper: str
    positions: Literal["encoder", "decoder", "memory"]


class StateGuidance:
    """``alpha * L_reg`` of Eq. 1-2 on states (``soft_target="states"``): layer t's guided activations against
    the stop-gradient of layer t+1's, over the real positions of this forward pass, as an aux-loss function.

    Every pair of ``soft`` names two ``nn.Linear`` per link (as for weights); a state is that Linear's output in
    the forward pass, bias included: ``K(t)``/``Q(t+1)`` for ``kq``, ``V``/``A V W_F`` for ``vf``, ``H W_1 + b_1``
    (before the activation) / the FFN output for ``ffn``. The rows are compared position by position, padded
    positions masked out (encoder: the mask its attention used; decoder: the padded target tokens; cross-attention
    keys and values: the memory's mask), and every forward call of a site counts (each MPT pass). The gradient
    reaches layer t's projection and everything below it (its input), never layer t+1.

    How the states are read, and what it costs. :meth:`attach` registers forward hooks that record only during
    ``model(...)`` (see :class:`StateRecorder`): ``out_proj``/``fc1``/``fc2`` outputs are kept as returned (no extra
    compute; the tensors live until the loss). ``q_proj``/``k_proj``/``v_proj`` are not called as modules by the
    fused self-attention (one product over the stacked weights), and their per-head copies are only returned
    with ``need_intermediates``, which switches attention to the eager path and keeps a ``B x H x T x T`` map per
    layer. So instead the hook applies the projection again to the attention's recorded input: one extra
    ``T x d_m x d_qk`` product per guided projection, layer and pass (a twelfth of a d_f = 4 d_m layer's matrix
    products; a guide that is never guided itself is computed without a graph), and the fused attention path stays
    on. No host synchronisation: masks and counts stay tensors.
    """

    def __init__(self, section: CrossformerConfig, sites: list[StateSite]) -> None:
        self.section = section
        self.sites = sites
        self.recorder = StateRecorder()

    @classmethod
    def attach(cls, section: CrossformerConfig, cfg: ComposedConfig, model: nn.Module) -> "StateGuidance":
        """Build the state terms of ``section.soft`` on ``model`` and register the hooks that record them."""
        links = collect_links(section, cfg, list(section.soft), "crossformer.soft", model_blocks(model))
        sites = [StateSite(link.lower_path, link.upper_path, _positions(link.side, link.lower_path))
                 for link in links]
        guided = {site.lower for site in sites}
        outputs: list[str] = []
        projections: dict[str, list[tuple[str, bool]]] = {}
        for path in sorted({path for site in sites for path in (site.lower, site.upper)}):
            block, _, name = path.rpartition(".")
            if name in _PROJECTIONS:
                projections.setdefault(block, []).append((name, path in guided))
            else:
                outputs.append(path)
        guidance = cls(section, sites)
        record_forward(guidance.recorder, model, outputs, {block: tuple(names) for block, names in projections.items()},
                       causal_lm=cfg.arch == "causal_lm", pad_id=cfg.pad_id)
        return guidance

    def __call__(self, model: nn.Module) -> Tensor:
        s, recorder = self.section, self.recorder
        if not recorder.armed:
            raise RuntimeError("crossformer.soft_target='states' compares the activations of a forward pass: the "
                               "term exists only inside model(...), which returns it in output.aux_losses")
        terms = []
        for site in self.sites:
            lowers, uppers = recorder.states.get(site.lower, []), recorder.states.get(site.upper, [])
            if not lowers or len(lowers) != len(uppers):
                raise RuntimeError(f"crossformer.soft_target='states': this forward pass recorded {len(lowers)} "
                                   f"state(s) of {site.lower} and {len(uppers)} of {site.upper}; both must be "
                                   "recorded once per call (was a module replaced after the model was built?)")
            terms.append(state_distance(lowers, uppers, recorder.padding.get(site.positions), s.p, s.sg_norm,
                                        s.reduction))
        return s.alpha * torch.stack(terms).sum()


def state_distance(lowers: list[Tensor], uppers: list[Tensor], padding: Optional[Tensor], p: int, norm: str,
                   reduction: str) -> Tensor:
    """One term of Eq. 1 on states: ``(B, T, width)`` outputs of layer t against the stop-gradient of layer t+1's,
    one pair per forward call, with the rows where ``padding`` (B, T) is True left out of the sum and the count."""
    diffs, count = [], None
    for lower, upper in zip(lowers, uppers, strict=True):
        diff = lower - upper.detach()
        if padding is not None:
            diff = diff.masked_fill(padding.unsqueeze(-1), 0.0)
            real = (~padding).sum() * diff.shape[-1]
            count = real if count is None else count + real
        diffs.append(diff.flatten())
    if count is not None:
        count = count.clamp_min(1)
    return reduce_distance(torch.cat(diffs), p, norm, reduction, count)


def _positions(side: str, path: str) -> Literal["encoder", "decoder", "memory"]:
    """Whose positions a site's rows are: cross-attention keys and values are the memory's, the rest their stack's."""
    if side == "cross" and path.rpartition(".")[2] in ("k_proj", "v_proj"):
        return "memory"
    return "encoder" if side == "encoder" else "decoder"


def hard_savings(pair: str, n_layers: int, d_model: int, d_ffn: int, qk_dim: Optional[int] = None, *,
                 bias: bool = True, ffn_order: str = "w2_w1") -> int:
    """Exact parameters saved by hard-guiding ``pair`` in one stack of ``n_layers`` layers.

    T-1 adjacent pairs are tied. Attention orders save ``(T-1)(d_m d_qk + d_qk)``; ``vf`` saves
    ``(T-1)(d_m^2 + d_m)``; ``ffn`` ties the odd-t matrix ``floor(T/2)`` times and the even-t one
    ``floor((T-1)/2)`` times, and since W_1's bias has d_f entries and W_2's d_m, the total depends on T's parity:
    ``floor(T/2)(d_m d_f + b_odd) + floor((T-1)/2)(d_m d_f + b_even)``. Without biases these are the paper's
    ``(T-1) d_m^2`` and ``4 (T-1) d_m^2`` (d_f = 4 d_m), i.e. Sec. 2.2's per-block figures in the large-T limit.
    """
    ties = n_layers - 1
    if pair in ATTENTION_ORDERS:
        width = qk_dim or d_model
        return ties * (d_model * width + (width if bias else 0))
    if pair == "vf":
        return ties * (d_model * d_model + (d_model if bias else 0))
    bias_of = {"fc1": d_ffn, "fc2": d_model}
    odd_t, even_t = ALTERNATIONS[ffn_order]
    odd, even = n_layers // 2, (n_layers - 1) // 2
    return (odd + even) * d_model * d_ffn + (odd * bias_of[odd_t] + even * bias_of[even_t] if bias else 0)


def _check_unique(key: str, values: Any) -> None:
    """A list field holds a list (its names are checked against the ``Literal`` by ``check_choices``), each name
    once."""
    if not isinstance(values, (list, tuple)):
        raise ConfigError(f"{key} must be a list, got {values!r}")
    repeated = sorted({value for value in values if list(values).count(value) > 1})
    if repeated:
        raise ConfigError(f"{key}={list(values)} lists {repeated} more than once")


def _variant(hard: list[str], soft: list[str], gat: Optional[str] = None) -> Callable[[VariantContext], dict]:
    """Hard/soft pairs for a Transformer; on GAT (Crossformer Sec. 3.3, Table 5) its own ``crossformer`` field."""

    def overrides(ctx: VariantContext) -> dict[str, Any]:
        if ctx.form("crossformer") == "hard_pair":
            if gat is None:
                raise VariantError(f"this Crossformer variant has no GAT form on task {ctx.task!r}: GAT takes one "
                                   "hard pair (Crossformer Table 5: key-query or FFN); use crossformer_kq or "
                                   "crossformer_ffn")
            return {"crossformer": gat}
        ctx.transformer_fields("Crossformer")
        out: dict[str, Any] = {}
        if hard:
            out["crossformer.hard"] = list(hard)
        if soft:
            out["crossformer.soft"] = list(soft)
        return out

    return overrides


class _CrossformerMethod(MethodBase):
    """Nothing to replace before the build: Crossformer reuses the plain modules and only ties or regularises them."""

    name = "crossformer"
    config_class = CrossformerConfig
    ties_only = True  # hard guidance ties weights, soft guidance adds a training loss: the forward pass is plain
    variants = {
        "crossformer_kq": NamedVariant("Crossformer-Key-Query hard guidance (Eq. 3; Tables 1-2, Table 5 on GAT)",
                                       _variant(["kq"], [], gat="kq")),
        "crossformer_vf": NamedVariant("Crossformer-Value hard guidance (Eq. 6; Tables 1-2)", _variant(["vf"], [])),
        "crossformer_ffn": NamedVariant("Crossformer-FFN hard guidance (Eq. 5; Tables 1-2, Table 5 on GAT)",
                                        _variant(["ffn"], [], gat="ffn")),
        "crossformer_all": NamedVariant("Crossformer-All: key-query, value-fusion and FFN hard guidance (Sec. 2.2, "
                                        "Table 2)", _variant(["kq", "vf", "ffn"], [])),
        "crossformer_sg": NamedVariant("Crossformer-SG: soft guidance of key-query, value-fusion and FFN, L2, "
                                       "alpha=0.01 (Eq. 1-2, Table 1 left, App. A.1.2)",
                                       _variant([], ["kq", "vf", "ffn"])),
    }
    examples = (CompositionExample("crossformer", {"hard": ["kq", "vf", "ffn"]}),
                CompositionExample("crossformer_soft", {"soft": ["kq", "vf", "ffn"], "alpha": 0.1}))
    # Every pair ties or compares the plain projections and FFNs, which these replace (collect_links)
    conflicts = (Conflict("lightweight", "lightweight"), Conflict("conv_branch", "conv_branch"))
    lm_examples = {"crossformer_hard": {"hard": ["kq"]}, "crossformer_soft": {"soft": ["kq"]}}

    def restructures(self, section: CrossformerConfig) -> bool:
        """Hard guidance ties matrices the checkpoint holds apart; soft guidance is only a loss."""
        return bool(section.hard)

    def finalize(self, section: CrossformerConfig, cfg: ComposedConfig, model: nn.Module) -> None:
        """Tie the hard pairs top-down and register the soft-guidance loss (with its recording hooks for states).

        Top-down order makes the chained orders (``qq``, ``kk``) end on one tensor: layer T-2 first takes layer
        T-1's matrix, then layer T-3 takes that one, and so on; the upper layer's initialisation survives.
        """
        links = collect_links(section, cfg, list(section.hard), "crossformer.hard", model_blocks(model))
        for link in reversed(links):
            tie(link, section.include_bias)
        if section.soft and section.soft_target == "states":
            model.aux_loss_fns["crossformer_sg"] = StateGuidance.attach(section, cfg, model)
        elif section.soft:
            model.aux_loss_fns["crossformer_sg"] = SoftGuidance(section, cfg)


METHOD = _CrossformerMethod()
