"""Every named model of interlayer in one listing: what ``interlayer models`` prints.

The presets live in five registries because they build five kinds of model with their own configs: the
Transformer presets (:mod:`interlayer.registry`, used by translation and the text tasks), the image models
(:mod:`interlayer.vision`, the ``fashion_mnist`` task), the GAT models (:mod:`interlayer.baselines.gat`, ``cora``
and ``citeseer``), the text CNN (:mod:`interlayer.baselines.cnn_text`, the text tasks) and MCAN
(:mod:`interlayer.models.mcan`, visual question answering). A user asking "what
can I train" should not need to know that, so this module lists all of them, each family with the input size its
MAdds are counted at: ``length`` tokens for sequences, one image for the image models, the bundled graph for GAT.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from torch import nn

from .accounting import count_madds, count_parameters
from .tables import format_table, human
from .baselines.cnn_text import MODEL_TYPE as CNN_TYPE
from .baselines.cnn_text import CNNTextConfig, cnn_from_dict
from .baselines.gat import GAT_PRESETS, create_gat
from .core.config import ConfigError
from .models.mcan import MCAN_PRESETS, create_mcan
from .registry import PRESETS, create_model
from .vision import VISION_PRESETS, create_vision_model


@dataclass(frozen=True)
class Family:
    """One registry: its preset names, how to build one, the tasks that train it, and what its
    MAdds are counted on (``unit``, a column header) and how (``madds(name, model, length)``)."""

    title: str
    tasks: str
    presets: tuple[str, ...]
    build: Callable[[str], nn.Module]
    unit: str
    madds: Callable[[str, nn.Module, int], str]


def _sequence_madds(name: str, model: nn.Module, length: int) -> str:
    return human(count_madds(model, length))


def _image_madds(name: str, model: nn.Module, length: int) -> str:
    return human(count_madds(model, model.config.tokens))


@functools.lru_cache(maxsize=None)
def _graph_size(dataset: str) -> tuple[int, int]:
    """Nodes and directed edges of a bundled Planetoid graph, read once per listing."""
    from .data.planetoid import load_planetoid

    graph = load_planetoid(f"bundled:planetoid/{dataset}.npz")
    return graph.num_nodes, graph.num_edges


def _vqa_madds(name: str, model: nn.Module, length: int) -> str:
    return human(count_madds(model, None))


def _graph_madds(name: str, model: nn.Module, length: int) -> str:
    """Over the bundled graph the preset is made for (``gat_cora...`` -> Cora, ``gat_citeseer...`` -> Citeseer)."""
    return human(count_madds(model, *_graph_size("cora" if name.startswith("gat_cora") else "citeseer")))


def _families(length: int) -> list[Family]:
    tokens = f"MAdds @ {length} tokens"
    return [
        Family("Transformer presets", "lm, translation, sst5, sst2, sick, mrpc", tuple(PRESETS), create_model, tokens,
               _sequence_madds),
        Family("Text CNN (PA Table 1)", "sst5, sst2, sick, mrpc", (CNN_TYPE,),
               lambda name: cnn_from_dict(CNNTextConfig().to_dict()), tokens, _sequence_madds),
        Family("Image models", "fashion_mnist", tuple(VISION_PRESETS),
               create_vision_model, "MAdds per image", _image_madds),
        Family("GAT", "cora, citeseer", tuple(GAT_PRESETS), create_gat,
               "MAdds per pass over the graph", _graph_madds),
        Family("MCAN (VQA)", "vqa", tuple(MCAN_PRESETS), create_mcan,
               "MAdds @ 14 question tokens + 100 regions", _vqa_madds),
    ]


def all_model_names() -> list[str]:
    return sorted(name for family in _families(0) for name in family.presets)


def build_named(name: str) -> nn.Module:
    """The model of any name ``interlayer models`` lists, whatever its family."""
    for family in _families(0):
        if name in family.presets:
            return family.build(name)
    raise ConfigError(f"unknown model preset {name!r}; known: {', '.join(all_model_names())}")


def model_catalog(length: int = 64, names: Optional[Sequence[str]] = None) -> str:
    """A table per family of every model (or only ``names``): parameters and the MAdds of one forward pass.

    Text models are counted at their presets' placeholder vocabulary; a task replaces it with the size of the
    vocabulary it builds, so a run's ``results.json`` holds the exact figures for its data.
    """
    wanted = set(names or [])
    unknown = sorted(wanted - set(all_model_names()))
    if unknown:
        raise ConfigError(f"unknown model preset(s) {unknown}; known: {', '.join(all_model_names())}")
    parts = []
    for family in _families(length):
        rows = []
        for name in sorted(family.presets):
            if wanted and name not in wanted:
                continue
            model = family.build(name)
            params = count_parameters(model)
            rows.append([name, f"{params:,}", human(params), family.madds(name, model, length)])
        if rows:
            parts.append(f"{family.title} (tasks: {family.tasks})\n\n"
                         + format_table(["preset", "parameters", "params", family.unit], rows))
    return "\n\n".join(parts)
