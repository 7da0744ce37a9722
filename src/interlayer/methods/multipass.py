"""Multi-Pass Transformer (MPT; Gao, Hori, Geng, Hori & Le Roux, "Multi-Pass Transformer for Machine Translation",
2020, arXiv:2009.11382): the encoder stack run P times with tied weights, each pass's layers feeding the next pass's.

Paper map:

* **Passes** (Sec. 3.2, Fig. 2): the inner stack cloned into an outer one sharing every weight (Table 2: 61.2M for
  Base and both MPTs): :class:`MultiPassEncoder`, ``passes`` (1 is exactly the plain encoder).
* **Connections** (Sec. 3.2): ``default``, inner layer k -> outer layer k (Table 1, ``[0,1,...,N-1]``); ``soft``,
  ``sum_j alpha_kj S_j^out`` with ``alpha_kj = softmax_j(w_kj)`` (Eq. 6); ``hard``, inner ``tau_k`` -> outer k for a
  ``permutation`` (best ``[0,4,1,5,2,3]``, Fig. 3, Table 1; :func:`hard_permutation`): ``connection``.
* **Routing** (Sec. 3.3, Fig. 4, Table 1): (a)/(b) the inner FFN output ``S^out`` (Eq. 3) added before / after the
  residual split (after: the self-attention branch only); (c)/(d) the same with ``S^mid`` (Eq. 2): ``routing``.
* **Training objective** (Sec. 3.2): the last pass, every pass summed, or one random pass per step: ``loss``; the
  early exit of the "low and high computation costs" regimes: ``exit_pass``.

Readings where the paper leaves room: the embedded source enters outer layer 0 (Eq. 6's unnamed ``S~_{-1}^out``),
since Table 2's caption defines the "6+6-layer (tied weights)" baseline as MPT *without* feeding the original input
to the 7th layer (that baseline is ``connection="tied_stack"``); the same embedded tensor (one dropout mask) is
reused, never re-embedded. Three passes (Sec. 5: "comparable", 28.4 BLEU; no wiring given): pass p+1 receives from
pass p exactly as pass 2 from pass 1, same permutation, and (soft) its *own* N x N weights, each transition being a
distinct inner/outer pair whose N^2 weights are as negligible as the paper's (``share_soft_weights=True``: one
matrix). ``soft_init`` 0.9: Eq. 6 with ``alpha = delta`` is the default MPT, but an exact delta saturates the softmax.

Options, outputs, composition, costs, presets and what the paper has beyond this: docs/methods/multipass.md.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Optional, Sequence

import torch
from torch import Tensor, nn

from ..core.components import Components
from ..core.config import TransformerConfig
from ..core.encoder import Encoder, EncoderOutput, Injector
from ..errors import ConfigError, VariantError
from .base import (
    MAX_MULTIPLIER,
    ComposedConfig,
    CompositionExample,
    MethodBase,
    NamedVariant,
    VariantContext,
    check_at_most,
)

Connection = Literal["default", "soft", "hard", "tied_stack"]
Routing = Literal["a", "b", "c", "d"]
PassLoss = Literal["last", "all", "random"]
DEFAULT_SOFT_INIT = 0.9


@dataclass
class MultiPassConfig:
    """Options of the Multi-Pass encoder (see the module docstring for the paper references).

    * ``passes``: P, the number of tied passes (paper: 2; 3 in Sec. 5). 1 is the plain encoder.
    * ``connection``: ``default`` (k <- k), ``soft`` (Eq. 6), ``hard`` (``permutation``), or ``tied_stack`` (Table
      2's "6+6-layer (tied weights)" baseline: pass p+1 starts from pass p's output, no embedding, no connections).
    * ``permutation``: tau for ``hard``: outer layer k receives inner layer ``permutation[k]``.
    * ``routing``: Fig. 4 pattern ``a`` (paper's choice), ``b``, ``c`` or ``d``.
    * ``loss``: which passes get the training loss: ``last`` (paper's main setting), ``all`` or ``random``.
    * ``exit_pass``: the pass whose output is used in eval mode (None: the last); later passes are not computed.
    * ``soft_init``: initial ``alpha_kk`` of the soft weights, off-diagonal ``(1-soft_init)/(N-1)``.
    * ``share_soft_weights``: one soft weight matrix for every transition (only matters for P >= 3).
    """

    WEIGHT_SIZES: ClassVar[frozenset[str]] = frozenset()  # no option sizes a saved tensor (checkpoint.py)

    passes: int = 2
    connection: Connection = "default"
    permutation: Optional[list[int]] = None
    routing: Routing = "a"
    loss: PassLoss = "last"
    exit_pass: Optional[int] = None
    soft_init: float = DEFAULT_SOFT_INIT
    share_soft_weights: bool = False

    def validate(self, cfg: TransformerConfig) -> None:
        """Raise :class:`ConfigError` naming the ``multipass.*`` key of the first setting that cannot work."""
        if self.passes < 1:
            raise ConfigError(f"multipass.passes={self.passes} must be at least 1 (1 is the plain encoder; the "
                              "paper uses 2, Sec. 5 also tries 3)")
        check_at_most("multipass.passes", self.passes, MAX_MULTIPLIER,
                      "each pass runs the whole encoder again (the paper uses 2; Sec. 5 also 3)")
        if self.exit_pass is not None and not 1 <= self.exit_pass <= self.passes:
            raise ConfigError(f"multipass.exit_pass={self.exit_pass} must lie in 1..{self.passes} "
                              f"(multipass.passes={self.passes}), or be null for the last pass")
        self._validate_permutation(cfg.enc_layers)
        if self.connection != "soft" and self.soft_init != DEFAULT_SOFT_INIT:
            raise ConfigError(f"multipass.soft_init={self.soft_init} only applies to multipass.connection='soft' "
                              f"(got connection={self.connection!r})")
        if not 0.0 < self.soft_init < 1.0:
            raise ConfigError(f"multipass.soft_init={self.soft_init} must lie in (0, 1): it is the initial "
                              "softmax weight alpha_kk of Eq. 6 (1 would need an infinite logit)")
        if self.share_soft_weights and self.connection != "soft":
            raise ConfigError("multipass.share_soft_weights=True only applies to multipass.connection='soft' "
                              f"(got connection={self.connection!r})")
        if self.connection == "tied_stack" and self.routing != "a":
            raise ConfigError(f"multipass.routing={self.routing!r} has no effect with connection='tied_stack', "
                              "which has no cross-pass connections to route; leave routing='a'")

    def _validate_permutation(self, n_layers: int) -> None:
        if self.connection != "hard":
            if self.permutation is not None:
                raise ConfigError(f"multipass.permutation={self.permutation} is only used with "
                                  f"multipass.connection='hard' (got connection={self.connection!r}); remove it "
                                  "or set connection='hard'")
            return
        if self.permutation is None:
            raise ConfigError(f"multipass.connection='hard' needs multipass.permutation, a permutation of "
                              f"0..{n_layers - 1} (enc_layers={n_layers}), e.g. {list(range(n_layers))}")
        problems = _permutation_problems(list(self.permutation), n_layers)
        if problems:
            raise ConfigError(f"multipass.permutation={self.permutation} is not a permutation of 0..{n_layers - 1}"
                              f" (enc_layers={n_layers}): {'; '.join(problems)}")

    @property
    def effective_exit_pass(self) -> int:
        return self.passes if self.exit_pass is None else self.exit_pass


def _permutation_problems(perm: list[int], n: int) -> list[str]:
    """Human-readable reasons why ``perm`` is not a permutation of ``0..n-1`` (empty when it is)."""
    problems = []
    if len(perm) != n:
        problems.append(f"it has {len(perm)} entries, enc_layers={n} needs {n}")
    counts = Counter(perm)
    outside = sorted(v for v in counts if not (isinstance(v, int) and 0 <= v < n))
    if outside:
        problems.append(f"{outside} outside 0..{n - 1}")
    repeated = sorted(v for v, c in counts.items() if c > 1)
    if repeated:
        problems.append(f"{repeated} repeated (each inner layer feeds exactly one outer layer)")
    missing = sorted(set(range(n)) - set(counts))
    if missing:
        problems.append(f"{missing} missing")
    return problems


def soft_init_logits(n_layers: int, soft_init: float) -> Tensor:
    """``w`` with ``softmax_j(w_kj) = soft_init`` on the diagonal and ``(1-soft_init)/(N-1)`` elsewhere.

    Eq. 6 with ``alpha = delta`` is the default MPT, so the soft model starts close to it; an exact delta needs
    ``w_kk = +inf`` and a saturated softmax passes almost no gradient to the off-diagonal weights, hence 0.9.
    """
    logits = torch.zeros(n_layers, n_layers)
    if n_layers > 1:
        logits.fill_diagonal_(math.log(soft_init * (n_layers - 1) / (1.0 - soft_init)))
    return logits


class MultiPassEncoder(Encoder):
    """The core encoder run for several tied passes (MPT Fig. 2); its layers are the plain encoder's modules.

    State-dict keys of the layers are identical to :class:`Encoder`'s, so a plain checkpoint loads into it; the
    only new parameter is ``connection_logits`` (the ``w_kj`` of Eq. 6, shape ``(P-1 | 1, N, N)``) for soft
    connections.

    Output: ``hidden`` is the output of the pass that is read (eval: ``exit_pass``; training: the last pass, or
    the sampled one for ``loss='random'``), after the final LayerNorm in pre-LN. ``exits`` lists every pass's
    output (each through the final LayerNorm) when training with ``loss='all'``, and is None otherwise.
    ``states``/``mids``/``attentions`` are concatenated over the passes run (pass-major; ``len(states) // N`` is
    the number of passes run). Predictive-attention logits restart at each pass's first layer: ``run_layers``
    starts every pass with no previous logits, as pass 1's layer 0 does, so tied layer 0 always sees the same
    kind of input and ``passes=1`` stays the plain encoder.
    """

    def __init__(self, cfg: ComposedConfig, components: Components, tokens: Optional[nn.Embedding]) -> None:
        super().__init__(cfg, components, tokens)
        section: MultiPassConfig = cfg.multipass
        self.passes = section.passes
        self.connection = section.connection
        self.routing = section.routing
        self.loss = section.loss
        n_layers = len(self.layers)
        self.permutation = list(section.permutation) if section.connection == "hard" else list(range(n_layers))
        self.connection_logits: Optional[nn.Parameter] = None
        if section.connection == "soft" and section.passes > 1:
            matrices = 1 if section.share_soft_weights else section.passes - 1
            init = soft_init_logits(n_layers, section.soft_init)
            self.connection_logits = nn.Parameter(init.expand(matrices, n_layers, n_layers).clone())
        self._exit_pass = section.effective_exit_pass

    @property
    def exit_pass(self) -> int:
        """The pass read in eval mode (1..P); set it at run time to trade accuracy for compute."""
        return self._exit_pass

    @exit_pass.setter
    def exit_pass(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= self.passes:
            raise ConfigError(f"multipass.exit_pass={value!r} must be an integer in 1..{self.passes}")
        self._exit_pass = value

    def process(self, x: Tensor, key_padding_mask: Optional[Tensor], *, need_intermediates: bool = False
                ) -> EncoderOutput:
        """The embedded input through the passes (the plain encoder runs the stack once)."""
        return self.run_passes(x, key_padding_mask, need_intermediates=need_intermediates)

    def passes_to_run(self) -> int:
        """Eval: up to ``exit_pass``. Training: all P, or one pass drawn uniformly from 1..P (``loss='random'``)."""
        if not self.training:
            return self._exit_pass
        if self.loss == "random":
            return int(torch.randint(1, self.passes + 1, ()).item())
        return self.passes

    def run_passes(self, x: Tensor, key_padding_mask: Optional[Tensor], *, need_intermediates: bool = False
                   ) -> EncoderOutput:
        """Run the tied stack ``passes_to_run()`` times over the embedded input ``x``."""
        outputs: list[EncoderOutput] = []
        for p in range(self.passes_to_run()):
            if p == 0:
                out = self.run_layers(x, key_padding_mask, need_intermediates=need_intermediates)
            elif self.connection == "tied_stack":
                out = self.run_layers(outputs[-1].states[-1], key_padding_mask,
                                      need_intermediates=need_intermediates)
            else:
                out = self.run_layers(x, key_padding_mask, injector=self._injector(outputs[-1], p - 1),
                                      need_intermediates=need_intermediates)
            outputs.append(out)
        last = outputs[-1]
        exits = [o.hidden for o in outputs] if self.training and self.loss == "all" else None
        return EncoderOutput(hidden=last.hidden, padding_mask=key_padding_mask,
                             states=[s for o in outputs for s in o.states], mids=[m for o in outputs for m in o.mids],
                             attentions=[a for o in outputs for a in o.attentions], exits=exits,
                             embedded=x)

    def _injector(self, inner: EncoderOutput, transition: int) -> Injector:
        """Outer layer k's additions from the previous ("inner") pass, placed as the routing pattern says."""
        features = inner.states if self.routing in ("a", "b") else inner.mids
        before_split = self.routing in ("a", "c")
        source = self._soft_source(features, transition) if self.connection_logits is not None else (
            lambda k: features[self.permutation[k]])

        def inject(k: int) -> tuple[Optional[Tensor], Optional[Tensor]]:
            add = source(k)
            return (add, None) if before_split else (None, add)

        return inject

    def _soft_source(self, features: Sequence[Tensor], transition: int) -> Callable[[int], Tensor]:
        """``k -> sum_j alpha_kj features_j`` (Eq. 6), as an element-wise weighted sum rather than a matmul: its
        ``N^2 T d`` multiply-adds are ~N/(12 d) of a layer's and are left out of :meth:`madds`."""
        stacked = torch.stack(list(features))  # the records may be read lazily (core.encoder.StateViews)
        alpha = self._alpha()[transition].to(stacked.dtype)
        return lambda k: (alpha[k].view(-1, 1, 1, 1) * stacked).sum(0)

    def _alpha(self) -> Tensor:
        """Soft weights ``alpha_kj = softmax_j(w_kj)`` (Eq. 6), one ``(N, N)`` matrix per transition."""
        alpha = torch.softmax(self.connection_logits, dim=-1)
        return alpha.expand(self.passes - 1, -1, -1)

    def connection_weights(self) -> Tensor:
        """``(P-1, N, N)``: entry ``[t, k, j]`` weights inner layer j of pass t+1 into outer layer k of pass t+2.

        Soft: the learned alphas (MPT Fig. 5); default/hard: the 0/1 matrix of the permutation; tied_stack: zeros.
        Detached, on CPU, for plotting.
        """
        n = len(self.layers)
        if self.connection_logits is not None:
            return self._alpha().detach().cpu().clone()
        weights = torch.zeros(self.passes - 1, n, n)
        if self.connection != "tied_stack":
            weights[:, torch.arange(n), torch.tensor(self.permutation, dtype=torch.long)] = 1.0
        return weights

    def madds(self, t: int) -> int:
        """Inference MAdds at the current ``exit_pass``: passes run x one stack (the soft sum's adds not counted)."""
        return self._exit_pass * super().madds(t)


def hard_permutation(n_layers: int) -> list[int]:
    """MPT's best searched hard pattern (Fig. 3: ``[0,4,1,5,2,3]`` for N=6) written as a rule for any depth N.

    Even outer layers ``0, 2, 4, ...`` take the shallow inner layers ``0, 1, 2, ...`` in order (short paths:
    "features from shallow layers in the first network are directly linked to deeper layers in the outer
    network", Sec. 4.2); odd outer layers take the deep inner half ``ceil(N/2) .. N-1`` rotated left by one
    (long paths: "features from deeper layer in the inner network should be added to shallow features in the
    outer network"), so outer layer 0 keeps inner layer 0 and never receives the last inner layer, which
    "results in significantly deteriorated performance". The rule gives exactly ``[0,4,1,5,2,3]`` at N=6 and
    ``[0,2,1]`` at N=3 (the project's ``mpt_hard_small_021`` preset); at N=4 ``[0,3,1,2]``, at N=5 ``[0,4,1,3,2]``.
    """
    shallow = list(range((n_layers + 1) // 2))
    deep = list(range((n_layers + 1) // 2, n_layers))
    deep = deep[1:] + deep[:1]
    return [shallow[k // 2] if k % 2 == 0 else deep[k // 2] for k in range(n_layers)]


def _variant(connection: str) -> Callable[[VariantContext], dict]:
    """Two passes, routing (a), with the given connections; ``hard``: :func:`hard_permutation` at the base's depth."""

    def overrides(ctx: VariantContext) -> dict[str, Any]:
        if ctx.excludes("multipass"):
            raise VariantError(f"MPT has no {ctx.slots.name} form: it takes only the "
                               f"{', '.join(sorted(ctx.slots.only or ()))} sections (the papers' methods on it)")
        fields = ctx.transformer_fields("MPT")
        out: dict[str, Any] = {"multipass.passes": 2, "multipass.connection": connection}
        if connection == "hard":
            n = fields["enc_layers"]
            permutation = hard_permutation(n)
            if permutation == list(range(n)):
                raise VariantError(f"mpt_hard at enc_layers={n} would be the default connection {permutation}: "
                                   "the only other permutation feeds the last inner layer to the first outer layer,"
                                   " which MPT Sec. 4.2 found to deteriorate results; use mpt, or more layers")
            out["multipass.permutation"] = permutation
        return out

    return overrides


class _MultiPassMethod(MethodBase):
    """Nothing to tie after the build: every pass calls the same layer modules."""

    name = "multipass"
    config_class = MultiPassConfig
    variants = {
        "mpt": NamedVariant("MPT default connections [0,1,...,N-1], 2 passes, routing (a) (MPT Table 1)",
                            _variant("default")),
        "mpt_soft": NamedVariant("MPT soft connections (Eq. 6), 2 passes, routing (a) (MPT Tables 1-2, Fig. 5)",
                                 _variant("soft")),
        "mpt_hard": NamedVariant("MPT hard connections, the best pattern [0,4,1,5,2,3] (Fig. 3) as a rule for the "
                                 "preset's depth (methods.multipass.hard_permutation), 2 passes", _variant("hard")),
    }
    examples = (CompositionExample("multipass", {"connection": "soft", "loss": "all"}),)
    lm_examples = {"multipass": {"passes": 2}}

    def customize(self, section: MultiPassConfig, cfg: ComposedConfig, components: Components) -> None:
        if components.encoder_class is not None:
            raise ConfigError(f"multipass replaces the encoder class, but another method already installed "
                              f"{components.encoder_class.__name__}; these two cannot be combined")
        components.encoder_class = MultiPassEncoder


METHOD = _MultiPassMethod()
