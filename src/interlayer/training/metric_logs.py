"""What a run logs, where people read it: one CSV file per split (``train.csv``, ``valid.csv``) and the scalars in
TensorBoard (``tb/``) or Weights & Biases (``train.logger``). Only the main process of a distributed run writes.

The engine hands each row over once per ``log_interval`` steps (training, already read from the device by
:mod:`.step_logs`) and once per validation; the columns of a split are its first row's, so a resumed run appends
to the same files. W&B also receives the run's configuration, and a resumed run continues the same W&B run (its id
is kept in ``RUN_DIR/wandb_id``).
"""
from __future__ import annotations

import csv
import os
import uuid
from pathlib import Path
from typing import Any, Optional

from ..fileio import write_atomic


class MetricLogs:
    """The module docstring's files for one run directory: :meth:`write` a row of a split, :meth:`close` at the
    end (``enabled=False`` on every process but the main one: nothing is written)."""

    def __init__(self, run_dir: Path, enabled: bool, logger: str = "tensorboard",
                 config: Optional[dict[str, Any]] = None) -> None:
        self.run_dir = run_dir
        self.enabled = enabled  # only rank 0 writes
        self.logger, self.config = logger, config or {}
        self._writer: Any = None
        self._wandb: Any = None

    def write(self, split: str, step: int, values: dict[str, float]) -> None:
        """Append ``values`` at optimiser step ``step`` to ``SPLIT.csv`` (its columns are the first row's) and send the
        numbers to TensorBoard or W&B as ``split/key``."""
        if not self.enabled:
            return
        path = self.run_dir / f"{split}.csv"
        row = {"step": step, **values}
        fresh = not path.exists()
        fields = list(row) if fresh else next(csv.reader(path.open()))
        with path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
            if fresh:
                writer.writeheader()
            writer.writerow(row)
        scalars = {f"{split}/{key}": value for key, value in values.items() if isinstance(value, (int, float))}
        if self.logger == "wandb":
            self._wandb_run().log(scalars, step=step)
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.run_dir / "tb"))
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def _wandb_run(self) -> Any:
        if self._wandb is None:
            import wandb

            id_file = self.run_dir / "wandb_id"
            run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:8]
            write_atomic(id_file, run_id)
            self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "interlayer"), id=run_id,
                                     name=self.run_dir.name, dir=str(self.run_dir), config=self.config,
                                     resume="allow", reinit="create_new")
        return self._wandb

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
