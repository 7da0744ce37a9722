"""The report's figures, drawn from the runs: the learning curves, the cost bars, Crossformer-SG's regulariser, and
the pictures that reload a run's ``best/`` model: PA's attention maps of the task's sample input (as PA Fig. 8) and
MPT's soft-connection weights. A picture that applies but cannot be drawn leaves a one-line note instead; a failure
to draw one never costs the report of finished runs. The drawing itself is :mod:`.plots`."""
from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from ..config_io import dataclass_from_dict
from ..errors import CheckpointError
from ..models.registry import load_pretrained
from ..training.config import TrainConfig
from . import plots
from .plan import Plan
from .records import RunRecord, VariantSummary, csv_curve, curve_axis, metric_label
from .stats import mean_std


def _section(model: dict[str, Any], name: str) -> dict[str, Any]:
    """A method section of a Transformer config (or of a vision model's encoder); {} when off or absent (GAT's
    ``crossformer`` is a plain string, not a section)."""
    encoder = model["encoder"] if isinstance(model.get("encoder"), dict) else model
    section = encoder.get(name)
    return section if isinstance(section, dict) else {}


def load_run_task(plan: Plan, run_dir: Path) -> Any:
    """The task of a finished run, with the run's own assets (its vocabulary), as a resumed run builds it."""
    stored = json.loads((run_dir / "run.json").read_text())
    train_cfg = dataclass_from_dict(TrainConfig, stored["train"], "train.")
    data_cfg = dataclass_from_dict(plan.spec.data_class, stored["data"], "data.")
    return plan.spec.make_task(data_cfg, train_cfg, run_dir)


def _best_model(summary: VariantSummary) -> tuple[Optional[RunRecord], Any]:
    for record in summary.finished():
        try:
            return record, load_pretrained(record.run_dir / "best").eval()
        except (CheckpointError, FileNotFoundError):
            continue
    return None, None


@torch.no_grad()
def encoder_attentions(model: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], Optional[torch.Tensor]]:
    """Every encoder layer's attention intermediates for one input (``need_intermediates=True``); nothing for a
    model without them (the CNN baseline, GAT)."""
    if "need_intermediates" not in inspect.signature(model.forward).parameters:
        return [], None
    output = model(*args, **kwargs, need_intermediates=True)
    encoder = getattr(output, "encoder", None)
    return list(getattr(encoder, "attentions", None) or []), getattr(encoder, "padding_mask", None)


def head_mean_probs(logits: torch.Tensor, padding_mask: Optional[torch.Tensor], causal: bool = False) -> np.ndarray:
    """Softmax over keys of (1, H, T, T) logits, padded keys (and with ``causal`` later keys) excluded, averaged
    over heads -> (T, T)."""
    x = logits[0].float()
    if padding_mask is not None:
        x = x.masked_fill(padding_mask[0][None, None, :], float("-inf"))
    if causal:
        t = x.shape[-1]
        x = x.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(x, dim=-1).mean(0).numpy()


def _baseline_attentions(plan: Plan, baseline: VariantSummary, summary: VariantSummary, tokens: list[str]
                         ) -> list[Any]:
    """The baseline's encoder attentions for the same sample (read with the baseline run's own vocabulary, and
    used only if it yields the same tokens); empty when there is no such model or it has no attention maps."""
    record, model = _best_model(baseline) if baseline is not summary else (None, None)
    sample = plan.spec.sample_input(load_run_task(plan, record.run_dir)) if model is not None else None
    if sample is None:
        return []
    args, kwargs, base_tokens = sample
    return encoder_attentions(model, args, kwargs)[0] if list(base_tokens) == list(tokens) else []


def _pa_picture(plan: Plan, summary: VariantSummary, baseline: VariantSummary, path: Path
                ) -> tuple[Optional[plots.Picture], str]:
    name = summary.name
    record, model = _best_model(summary)
    if model is None:
        return None, f"PA attention maps of {name}: skipped, no finished run with a best/ model yet."
    sample = plan.spec.sample_input(load_run_task(plan, record.run_dir))
    if sample is None:
        return None, f"PA attention maps of {name}: skipped, task {plan.spec.name!r} offers no sample input " \
                     "(TaskSpec.sample_input)."
    args, kwargs, tokens = sample
    attentions, mask = encoder_attentions(model, args, kwargs)
    layers = [i for i, a in enumerate(attentions) if a is not None and "predicted" in a.extras]
    if not layers:
        return None, f"PA attention maps of {name}: skipped, the model returned no predicted attention maps."
    base_attentions = _baseline_attentions(plan, baseline, summary, tokens)
    causal = getattr(getattr(model, "encoder", None), "causal", False)  # a language model attends backwards only
    rows = []
    for i in sorted({layers[0], layers[-1]}):
        att = attentions[i]
        maps = []
        base = base_attentions[i] if i < len(base_attentions) else None
        if base is not None and base.logits.shape[-2:] == att.logits.shape[-2:]:  # the same tokens
            label = "baseline" if baseline.name == "baseline" else f"baseline: {baseline.name}"
            maps.append((label, head_mean_probs(base.logits, mask, causal)))
        maps += [("PA combined (Eq. 4)", head_mean_probs(att.logits, mask, causal)),
                 ("CNN-predicted", head_mean_probs(att.extras["predicted"], mask, causal)),
                 ("self-attention", head_mean_probs(att.extras["self"], mask, causal))]
        rows.append((f"layer {i + 1}", maps))
    caption = (f"{name} ({record.name}): attention maps of the sample input, mean over heads. Columns as PA Fig. 8: "
               "the baseline's map (when it has one), the combined map softmax(alpha CNN(A_prev) + (1-alpha) A), the"
               " CNN prediction and the layer's own self-attention; rows: the first predicting layer and the last.")
    return plots.attention_maps(rows, tokens, f"PA attention maps: {name}", path, caption), ""


def _mpt_picture(summary: VariantSummary, path: Path) -> tuple[Optional[plots.Picture], str]:
    panels = []
    for record in summary.finished():
        try:
            model = load_pretrained(record.run_dir / "best")
        except (CheckpointError, FileNotFoundError):
            continue
        weights = model.encoder.connection_weights().numpy()
        for t, matrix in enumerate(weights):
            label = f"{record.name}" + (f", pass {t + 1} -> {t + 2}" if len(weights) > 1 else "")
            panels.append((label, matrix))
    if not panels:
        return None, f"MPT soft-connection weights of {summary.name}: skipped, no finished run with a best/ model yet."
    return plots.soft_connections(panels[:4], f"MPT soft connections: {summary.name}", path), ""


def figures(plan: Plan, summaries: list[VariantSummary], directory: Path) -> tuple[list[plots.Picture], list[str]]:
    """Every figure that applies, and a one-line note for each that applies but could not be drawn."""
    pictures, notes = [], []
    baseline = next(s for s in summaries if s.name == plan.settings.baseline)
    curves = plots.learning_curves({s.name: [r.curve for r in s.runs] for s in summaries},
                                   metric_label(plan.task.metric),
                                   baseline.name, directory / "learning_curves.png", curve_axis(plan)[1])
    if curves is None:
        notes.append("Learning curves: skipped, no run has validated yet.")
    else:
        pictures.append(curves)
    names = [s.name for s in summaries]
    units = plan.task.units
    pictures.append(plots.cost_bars(names, [
        ("parameters", "parameters (count)", [float(s.planned.parameters) for s in summaries]),
        (f"MAdds @ {'/'.join(map(str, baseline.planned.lengths))}", "multiply-adds per forward pass",
         [float(s.planned.madds) for s in summaries]),
        (f"training {units}/s (measured, mean ± std over seeds)", f"{units} per second", [s.speed for s in summaries],
         [mean_std(list(s.speeds.values()))[1] for s in summaries]),
        ("peak memory growth", "MiB", [s.memory for s in summaries])], baseline.name, directory / "cost.png"))
    sg = {s.name: [csv_curve(r.run_dir / "train.csv", "step", "crossformer_sg") for r in s.runs] for s in summaries
          if _section(s.planned.model, "crossformer").get("soft")}
    if sg:
        picture = plots.sg_curves(sg, directory / "crossformer_sg.png")
        if picture is None:
            notes.append("Crossformer-SG regulariser: skipped, no logged training step yet.")
        else:
            pictures.append(picture)
    for s in summaries:
        wanted: list[tuple[str, Callable[[], tuple[Optional[plots.Picture], str]]]] = []
        if _section(s.planned.model, "predictive"):
            wanted.append(("PA attention maps", functools.partial(
                _pa_picture, plan, s, baseline, directory / f"pa_attention_{s.name}.png")))
        if _section(s.planned.model, "multipass").get("connection") == "soft":
            wanted.append(("MPT soft-connection weights", functools.partial(
                _mpt_picture, s, directory / f"mpt_soft_{s.name}.png")))
        for title, draw in wanted:
            try:
                picture, note = draw()
            except Exception as err:  # a picture must not cost the report of finished runs
                picture, note = None, f"{title} of {s.name}: could not be drawn ({type(err).__name__}: {err})."
            if picture is not None:
                pictures.append(picture)
            if note:
                notes.append(note)
    return pictures, notes
