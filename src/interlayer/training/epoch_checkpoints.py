"""The epoch checkpoints: the weights at each epoch's end (``checkpoint<N>.safetensors``, the last
``train.keep_last`` kept; weights only, unlike the resumable ``checkpoint_last``) and their mean, the model
``averaged/`` holds (``train.average_last``: Vaswani et al. 2017, Sec. 6.1)."""
from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from ..checkpoint import canonical_state_dict
from ..fileio import atomic_path


def epoch_checkpoints(run_dir: Path) -> list[Path]:
    """``checkpoint<epoch>.safetensors`` files, oldest first."""
    return sorted(run_dir.glob("checkpoint[0-9]*.safetensors"), key=lambda p: int(p.stem[len("checkpoint"):]))


def write_epoch_checkpoint(model: nn.Module, run_dir: Path, epoch: int, keep_last: int) -> None:
    """``model``'s weights as ``checkpoint<epoch>.safetensors`` (atomically), then the oldest removed so that
    ``keep_last`` remain (0: all)."""
    weights = {k: v.detach().cpu().contiguous() for k, v in canonical_state_dict(model).items()}
    with atomic_path(run_dir / f"checkpoint{epoch}.safetensors") as tmp:
        save_file(weights, str(tmp))
    for old in epoch_checkpoints(run_dir)[:-keep_last or None]:
        old.unlink()


def average_weights(paths: list[Path]) -> dict[str, Tensor]:
    """The mean of the checkpoints' floating-point tensors (summed in float64, returned in their own dtype); other
    tensors (counters) are the first checkpoint's."""
    states = [load_file(str(p)) for p in paths]
    return {k: sum(s[k].double() for s in states).div(len(states)).to(states[0][k].dtype)
            if states[0][k].is_floating_point() else states[0][k] for k in states[0]}
