"""A checkpoint's tensors into an interlayer model: :func:`load_checkpoint_state` (and :func:`load_checkpoint`, what a
fine-tuning run calls on the model it built itself), with the :class:`ImportReport` of what went where; the checks
before any model is built (:func:`check_sizes`); the method sections that restructure the pretrained weights
(:func:`restructuring_sections`, each method's ``restructures``). The policies are :mod:`interlayer.pretrained.hf`'s
(its module docstring).
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from ..checkpoint import build_on_meta, check_buffers, check_config_sizes
from ..config import ModelConfig
from ..data.tokenizers.pretrained import PretrainedTokenizer
from ..errors import PretrainedError
from .exact_start import step_zero_notes
from .families import HeadLayout, HFFamily
from .hf_checkpoint import HFCheckpoint, checkpoint_head, config_pad_id, read_checkpoint
from .hf_core_config import AnyConfig, build, encoder_config

log = logging.getLogger(__name__)

REINITIALISE_HINT = ("these methods restructure the pretrained weights; pass reinitialise=True (CLI: --set "
                     "reinitialise=true) to load what fits and start the restructured parameters from their own "
                     "initialisation")


@dataclass
class ImportReport:
    """What an import did with every tensor (core names for the model, HF names for the checkpoint)."""

    source: str
    loaded: list[str] = field(default_factory=list)  # model parameters that received a checkpoint tensor
    initialised: list[str] = field(default_factory=list)  # model parameters left at their own initialisation
    ignored: list[str] = field(default_factory=list)  # checkpoint tensors with no place in the model
    restructured: list[str] = field(default_factory=list)  # checkpoint tensors a method replaced (reinitialise)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """What a run records (task.json): the counts, and by name what is new and what was left out."""
        counts = {"loaded": len(self.loaded), "initialised": len(self.initialised), "ignored": len(self.ignored)}
        out = {"source": self.source, "counts": counts, "initialised": list(self.initialised),
               "ignored": list(self.ignored), "notes": list(self.notes)}
        if self.restructured:
            counts["restructured"] = len(self.restructured)
            out["restructured"] = list(self.restructured)
        return out



def layers_in_weights(family: HFFamily, state: dict[str, Tensor]) -> int:
    """How many encoder layers the checkpoint's tensors hold: layer ``k`` counts when any of its names is there."""
    count, known = 0, set(family.layer_map(0))
    while True:
        names = set(family.layer_map(count + 1)) - known
        if not names & state.keys():
            return count
        known |= names
        count += 1


def check_sizes(checkpoint: HFCheckpoint, config: AnyConfig, *, reinitialise: bool = False) -> None:
    """Refuse a ``config.json`` whose sizes the weights do not hold, before any model is built.

    A folder from a stranger may declare ``num_hidden_layers=1000000`` over one layer of weights, or
    ``vocab_size=1e12``: building that model first would take the memory until the machine gives out. The layer
    count is compared with the layers the tensors hold (cheap); then the model is built on PyTorch's ``meta``
    device (shapes only, no memory) and every tensor checked against its parameter, which refuses any other size
    (vocabulary, width, positions, patches) naming the tensor, as the real load would. The method sections (the
    user's, on top of the checkpoint) and the build pass the checks every model folder gets
    (:mod:`interlayer.checkpoint`: no section size the tensors do not justify, a build stopped after twice the
    checkpoint's tensors, tables outside the weights bounded).
    """
    source = checkpoint.source
    declared = encoder_config(config).enc_layers
    present = layers_in_weights(checkpoint.family, checkpoint.state)
    if declared > present:
        family = checkpoint.family
        missing = sorted(set(family.layer_map(present + 1)) - set(family.layer_map(present)))
        raise PretrainedError(f"{source} lacks {family.title} encoder tensors {_first(missing)} (config.json "
                              f"declares {declared} layers, the weights hold {present}); refused before any model "
                              "was built: the folder is damaged or its config.json belongs to another model")
    shapes = {name: tuple(tensor.shape) for name, tensor in checkpoint.state.items()}
    encoder = encoder_config(config)
    sections = {method.name: asdict(section) for method, section in encoder.sections()}
    check_config_sizes(sections, shapes, config_class=type(encoder), source=f"{source} (method sections)",
                       holder=source, error=PretrainedError)
    shadow = build_on_meta(lambda: build(config), len(shapes), source=source, holder=f"{source}'s weights",
                           error=PretrainedError)
    load_checkpoint_state(shadow, checkpoint, reinitialise=reinitialise, log_report=False)
    check_buffers(shadow, shapes, source=source, holder=f"{source}'s weights", error=PretrainedError)


def restructuring_sections(cfg: ModelConfig) -> list[str]:
    """The method sections of ``cfg`` that restructure pretrained weights (they need ``reinitialise``), as each
    method declares (``restructures``: LW and the conv branch replace modules, CLA's reusing layers and SVFormer's
    later layers delete projections, Crossformer hard guidance and layer sharing tie matrices the checkpoint holds
    apart). An import without ``reinitialise`` fails for exactly these (tests/test_hf_gpt2.py checks every
    method)."""
    return [method.name for method, section in cfg.sections() if method.restructures(section)]



def load_checkpoint_state(model: nn.Module, checkpoint: HFCheckpoint, *, reinitialise: bool = False,
                          log_report: bool = True, measure_start: bool = True) -> ImportReport:
    """Copy the checkpoint's tensors into ``model`` (built from :func:`model_config`); see the module docstring.
    With ``measure_start`` and ``log_report`` (a real import, not the shape check) the report's notes also name
    every method section that changes the imported function before the first update, measured
    (:mod:`~interlayer.pretrained.exact_start`).

    Raises :class:`PretrainedError` when an encoder tensor is missing from the checkpoint, is unknown, has no
    place or another shape in the model, or two different tensors would land in one tied parameter (the last
    three are restructured parameters, left at their initialisation with ``reinitialise=True``).
    """
    family, state, source = checkpoint.family, checkpoint.state, checkpoint.source
    cfg = encoder_config(model.config)
    mapping = family.layer_map(cfg.enc_layers)
    missing = [name for name in mapping if name not in state]
    if missing:
        raise PretrainedError(f"{source} lacks {family.title} encoder tensors {_first(missing)} (for the "
                              f"{cfg.enc_layers} layers its config declares); found e.g. {_first(sorted(state))}")
    layout, classes = checkpoint_head(checkpoint, cfg.num_classes)
    pooler = layout.pooler if layout is not None and layout.pooler else family.pooler_map()
    if cfg.classifier_hidden:
        mapping.update({k: v for k, v in pooler.items() if k in state})
    mapping.update({k: v for k, v in family.output_map(cfg).items() if k in state})
    head_loaded = (layout is not None and classes == cfg.num_classes and cfg.pooling == "cls"
                   and layout.needs_pooler == bool(cfg.classifier_hidden))
    if head_loaded:
        mapping.update(layout.head)
    known = set(mapping) | set(family.ignorable) | set(family.pooler_map())
    unexpected = [k for k in state if k.startswith(family.namespaces) and k not in known]
    if unexpected:
        raise PretrainedError(f"{source} has encoder tensors this {family.title} layout does not know: "
                              f"{_first(unexpected)}")
    report = ImportReport(source=source)
    filled = _copy_state(model, family, mapping, state, report, source, reinitialise)
    params = dict(model.named_parameters(remove_duplicate=False))
    canonical = {id(p): n for n, p in reversed(list(params.items()))}
    report.initialised = [name for pid, name in sorted(canonical.items(), key=lambda x: x[1]) if pid not in filled]
    report.ignored = sorted(k for k in state if k not in mapping)
    _init_fresh_heads(model, family, report, float(checkpoint.hf.get("initializer_range", 0.02)))
    report.notes += checkpoint.notes + _notes(checkpoint, cfg, report, layout, head_loaded, classes)
    if log_report and measure_start:  # not for the shape check on the meta device (check_sizes)
        report.notes += step_zero_notes(model, build, lambda plain: load_checkpoint_state(
            plain, checkpoint, log_report=False).initialised)
        log.info("imported %s: %d tensors loaded, initialised %s, ignored %s, restructured %s; %s", source,
                 len(report.loaded), report.initialised, report.ignored, report.restructured, " ".join(report.notes))
    return report


def load_checkpoint(model: nn.Module, directory: Union[str, Path]) -> ImportReport:
    """Copy checkpoint ``directory``'s tensors into ``model``, built from a config the import made for it.

    Why: a fine-tuning run builds its model itself, after seeding, so that what the checkpoint lacks (PA's
    convolutions, a new head) gets the run's seeded initialisation; this is the loading half of the import (the
    same head policy, report and notes). ``torch.manual_seed(s)`` then ``build_model(cfg)`` and
    ``load_checkpoint`` give exactly the model of ``torch.manual_seed(s)`` then ``import_bert`` with that config's
    options. A config with a section that restructures pretrained weights was only built because the import was
    asked to re-initialise them (``reinitialise=True``), so they are re-initialised here too. The model is left in
    its current mode.
    """
    reinitialise = bool(restructuring_sections(encoder_config(model.config)))
    return load_checkpoint_state(model, read_checkpoint(directory), reinitialise=reinitialise)



def _copy_state(model: nn.Module, family: HFFamily, mapping: dict[str, str], state: dict[str, Tensor],
                report: ImportReport, source: str, reinitialise: bool) -> set[int]:
    """Copy ``mapping``'s tensors; returns the ids of the parameters that received one."""
    cfg = encoder_config(model.config)
    params = dict(model.named_parameters(remove_duplicate=False))
    groups: dict[int, list[tuple[str, str, Tensor]]] = {}
    for hf_name, core_name in mapping.items():
        tensor = family.to_core(hf_name, state[hf_name])
        if core_name not in params:
            problem = (f"{hf_name} has no place in this model ({core_name} does not exist): {_methods(cfg)} replaced "
                       "the pretrained module")
        elif params[core_name].shape != tensor.shape:
            problem = (f"{hf_name} has shape {tuple(tensor.shape)} but {core_name} expects "
                       f"{tuple(params[core_name].shape)} ({_methods(cfg)} changed the module)")
        else:
            groups.setdefault(id(params[core_name]), []).append((hf_name, core_name, tensor))
            continue
        if not reinitialise or not cfg.sections():
            raise PretrainedError(f"{source}: {problem}" + (f"; {REINITIALISE_HINT}" if cfg.sections() else ""))
        report.restructured.append(hf_name)
    filled: set[int] = set()
    with torch.no_grad():
        for pid, group in groups.items():
            (first, core_name, tensor), rest = group[0], group[1:]
            clash = next((other for other in rest if not torch.equal(other[2].to(tensor.dtype), tensor)), None)
            if clash is not None:
                if not reinitialise:
                    raise PretrainedError(f"{source}: {clash[1]} is tied to the parameter that received {first}, but "
                                          f"{clash[0]} holds different pretrained values; {_methods(cfg)} ties "
                                          "matrices the checkpoint keeps apart (use crossformer.soft to guide them "
                                          f"instead); {REINITIALISE_HINT}")
                report.restructured += [name for name, _, _ in group]
                continue
            params[core_name].copy_(tensor)
            filled.add(pid)
            report.loaded += [name for _, name, _ in group]
    report.loaded.sort()
    report.restructured.sort()
    return filled


def _init_fresh_heads(model: nn.Module, family: HFFamily, report: ImportReport, std: float) -> None:
    """A pooler/head the checkpoint did not provide: ``transformers``' init (normal(0, std), zero bias)."""
    for name in ("pooler.0", "head"):
        module_name = family.core_prefix + name
        if f"{module_name}.weight" not in report.initialised:
            continue
        module = model.get_submodule(module_name)
        nn.init.normal_(module.weight, std=std)
        nn.init.zeros_(module.bias)
        if name == "pooler.0":
            warnings.warn(f"{report.source} has no pooler weights: the pooler was initialised randomly (fine-tune "
                          "before use, or import with pooling='mean' / pooler=False)", stacklevel=5)
            report.notes.append("the pooler was initialised randomly (not in the checkpoint)")


def _notes(checkpoint: HFCheckpoint, cfg: ModelConfig, report: ImportReport, layout: Optional[HeadLayout],
           head_loaded: bool, classes: int) -> list[str]:
    """What the import could not carry over exactly, in words."""
    hf, notes, tokenizer = checkpoint.hf, [], checkpoint.tokenizer
    if isinstance(tokenizer, PretrainedTokenizer) and tokenizer.pad_id != config_pad_id(hf):
        notes.append(f"pad id {tokenizer.pad_id} is the tokenizer's {tokenizer.special_tokens['pad_token']}, not "
                     f"config.json's pad_token_id={config_pad_id(hf)}")
    if layout is not None and not head_loaded:
        notes.append(f"the checkpoint's {classes}-class classifier was not loaded (num_classes={cfg.num_classes}, "
                     f"pooling={cfg.pooling!r}, pooler={bool(cfg.classifier_hidden)}): the head is new")
    task_head = [name for name in report.ignored if name.startswith(("classifier.", "pre_classifier."))]
    if layout is None and task_head:
        notes.append(f"the checkpoint's task head ({_first(task_head)}) has no core equivalent (its activation is not "
                     "the core pooler's tanh): ignored, the head is new")
    if hf.get("classifier_dropout") not in (None, hf.get("hidden_dropout_prob")):
        notes.append(f"classifier_dropout={hf['classifier_dropout']} is not used: the core's head dropout is "
                     f"dropout={cfg.dropout}")
    return notes


def _methods(cfg: ModelConfig) -> str:
    names = [m.name for m, _ in cfg.sections()]
    return f"the method section(s) {', '.join(names)}" if names else "the config"


def _first(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" ... ({len(names)} in all)" if len(names) > n else "")
