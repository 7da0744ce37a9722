"""What the two tasks over region features share (LW-Transformer Sec. IV: captioning, :mod:`.captioning`, and
referring expression comprehension, :mod:`.rec`): the region model's fields their data decides, a preset resolved
into a region model with the task's head, and the word list a run saved."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..data import scenes
from ..data.bpe import PAD_ID
from ..errors import ConfigError, DataError
from ..fileio import read_json
from ..models.registry import get_config


def region_fields(data: Any, vocab_size: int) -> dict[str, Any]:
    """The region model's fields ``data`` (a task's data settings) decides: the regions' width (the generated
    scenes' own, else ``data.feature_dim``), how many are read, the words per caption or expression and the
    vocabulary."""
    feature_dim = scenes.FEATURE_DIM if data.dataset == "scenes" else data.feature_dim
    return {"feature_dim": feature_dim, "max_regions": data.max_regions, "max_words": data.max_words,
            "src_vocab_size": vocab_size, "pad_id": PAD_ID}


def region_model(preset: str, model_sets: dict[str, Any], fields: dict[str, Any], head: str, needs: str) -> Any:
    """A region preset (or config file) with the data's ``fields``, then the user's overrides; refused when its
    head is not ``head`` (``needs`` says what the task needs) or an override changes the regions' width."""
    config = get_config(get_config(preset, family="region", **fields), family="region", **model_sets)
    if config.head != head:
        raise ConfigError(f"preset {preset!r} is a {config.head} model; {needs}")
    if config.feature_dim != fields["feature_dim"]:
        raise ConfigError(f"feature_dim={config.feature_dim}: the data's regions have {fields['feature_dim']} values "
                          "(data.feature_dim); drop the override")
    return config


def saved_words(run_dir: Optional[Path]) -> Optional[list[str]]:
    """The word list a run saved (``task.json``: a resumed run keeps its vocabulary), or None for a new run."""
    if run_dir is None or not (run_dir / "task.json").is_file():
        return None
    return read_json(run_dir / "task.json", DataError, within=run_dir)["words"]
