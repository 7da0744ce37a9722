"""Does a method added to an imported model change what it computes before the first update? Measured at import.

A method section added on top of a checkpoint (``from_hf(..., extra_sections=...)``, ``train ... --pretrained
--set``) may leave the imported function exactly as it was (Crossformer soft guidance is only a loss; ties of
equal tensors; Predictive Attention with ``alpha_warmup_steps``; value residuals with ``lambda_warmup_steps``) or
change it at once (PA without the warm-up, ResFormer's ``[0.5, 0.5]`` mix, dynamic hyper-connections' fresh
projections, re-initialised layers). The import report says which, with the size, instead of leaving it to be
found in the first validation score.

How (:func:`step_zero_notes`): on a small fixed probe input (2 rows of up to 8 tokens, or 2 random images) the logits of
the plain import (no method section, the checkpoint's tensors; what the checkpoint lacks, a new head, copied from the
imported model) are compared with those of the model with each section alone, whose parameters are copied from the
imported model (so a method's fresh initialisation is the one the model really has). Every model here runs eager
attention, so a difference is the method's, not fused-versus-eager rounding; a section is named when its logits move by
more than :data:`TOLERANCE`. One plain and one single-section model per section are built and freed (for a large
checkpoint this is the import's cost again per section); the random number generators are left as they were, so a seeded
run draws what it drew before.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from ..models.vision import VisionConfig

TOLERANCE = 1e-6


def _with_sections(config: Any, keep: Optional[str]) -> Any:
    """``config`` (a text or vision config) with only the section ``keep`` (None: none), read with eager
    attention."""
    encoder = config.encoder if isinstance(config, VisionConfig) else config
    sections = {m.name: (section if m.name == keep else None) for m, section in encoder.sections()}
    encoder = dataclasses.replace(encoder, attn_impl="eager", **sections)
    return dataclasses.replace(config, encoder=encoder) if isinstance(config, VisionConfig) else encoder


def probe_input(model: nn.Module) -> dict[str, Tensor]:
    """A fixed small input for ``model``: ``input_ids`` without the padding id, or ``pixel_values``."""
    generator = torch.Generator().manual_seed(0)
    config = model.config
    if isinstance(config, VisionConfig):
        shape = tuple(config.input_size) or (config.channels, config.image_height, config.image_width)
        return {"pixel_values": torch.rand((2, *shape), generator=generator)}
    cfg: ModelConfig = config
    first = cfg.pad_id + 1 if cfg.position_start == "after_pad" else 0
    length = max(1, min(8, cfg.max_positions - first))
    ids = torch.randint(0, cfg.src_vocab_size - 1, (2, length), generator=generator)
    if cfg.arch != "causal_lm":
        ids = ids + (ids >= cfg.pad_id).long()  # never the padding id, which the classifiers mask
    return {"input_ids": ids}


@torch.no_grad()
def _logits(model: nn.Module, probe: dict[str, Tensor], device: torch.device) -> Tensor:
    return model.to(device).eval()(**{k: v.to(device) for k, v in probe.items()}).logits.float()


def _copy(state: dict[str, Tensor], into: nn.Module, names: Optional[set[str]] = None) -> None:
    """Load the tensors of ``state`` that ``into`` has (with the same shape), only ``names`` when given."""
    own = into.state_dict()
    into.load_state_dict({k: v for k, v in state.items() if k in own and own[k].shape == v.shape
                          and (names is None or k in names)}, strict=False)


def step_zero_notes(model: nn.Module, build: Callable[[Any], nn.Module],
                    load_plain: Callable[[nn.Module], list[str]]) -> list[str]:
    """One note per method section of ``model`` that changes the imported function before the first update, with
    the largest change of the probe's logits (module docstring). ``build`` makes a model from a config;
    ``load_plain`` loads the checkpoint into the plain model and returns the names it did not fill."""
    config = model.config
    encoder = config.encoder if isinstance(config, VisionConfig) else config
    sections = encoder.sections()
    if not sections:
        return []
    device = next(model.parameters()).device
    probe = probe_input(model)
    state = model.state_dict()
    notes = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        plain = build(_with_sections(config, None))
        _copy(state, plain, set(load_plain(plain)))
        reference = _logits(plain, probe, device)
        del plain
        for method, section in sections:
            name = method.name
            alone = build(_with_sections(config, name))
            _copy(state, alone)
            change = float((_logits(alone, probe, device) - reference).abs().max())
            del alone
            if change <= TOLERANCE:
                continue
            exact = method.exact_start(section)  # the option that starts the method exactly, where it has one
            hint = f"; {name}.{exact}=N starts exactly and ramps it in over N steps" if exact else ""
            notes.append(f"{name} changes the imported model's function before the first update: its logits move "
                         f"by up to {change:.3g} on a probe input of shape "
                         f"{tuple(next(iter(probe.values())).shape)}{hint}")
    return notes
