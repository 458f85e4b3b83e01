"""Per-step metrics: ``metrics.jsonl`` always, TensorBoard and wandb when enabled (imported lazily).

``rows`` (a resumed run): the rows kept from before the checkpoint; the file is rewritten to hold exactly
them before new rows are appended (they are not sent to TensorBoard / wandb again).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, run_dir: str | Path, *, tensorboard: bool = False, wandb: bool = False, wandb_project: str = "digenrl", config: dict | None = None, rows: list[dict[str, Any]] | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if rows is not None:  # atomically, so a kill now cannot lose the kept rows
            from digenrl.safe_files import atomic_write_bytes

            atomic_write_bytes(self.path, "".join(json.dumps(r) + "\n" for r in rows).encode())
        self._fh = self.path.open("a" if rows is not None else "w")
        self._tb = None
        self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if wandb:
            import wandb as wb

            self._wandb = wb.init(project=wandb_project, config=config, dir=str(run_dir))
        self.rows: list[dict[str, Any]] = list(rows or [])

    def log(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
        step = int(row.get("step", len(self.rows)))
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
