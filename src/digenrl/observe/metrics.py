"""Per-step metrics: ``metrics.jsonl`` always, TensorBoard and wandb when enabled (imported lazily): every
numeric value of a row as a scalar (``reward/<name>`` per reward), and the sample grids as images (``image``).

``rows`` (a resumed run): the rows kept from before the checkpoint; the file is rewritten to hold exactly
them before new rows are appended (they are not sent to TensorBoard / wandb again).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from digenrl.safe_files import atomic_write_bytes, naming


class MetricsWriter:
    def __init__(self, run_dir: str | Path, *, tensorboard: bool = False, wandb: bool = False, wandb_project: str = "digenrl", config: dict | None = None, rows: list[dict[str, Any]] | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if rows is not None:  # atomically, so a kill now cannot lose the kept rows
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
        with naming(self.path):  # a full disk: the error names metrics.jsonl
            self._fh.write(json.dumps(row) + "\n")
            self._fh.flush()
        step = int(row.get("step", len(self.rows)))
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    @property
    def sends_images(self) -> bool:
        """TensorBoard or wandb is on (a picture has somewhere to go besides run_dir)."""
        return self._tb is not None or self._wandb is not None

    def image(self, tag: str, png: str | Path, step: int) -> None:
        """A picture the run wrote (a sample grid PNG) to TensorBoard and wandb, where they are on."""
        if not self.sends_images:
            return
        import matplotlib.image as mpimg
        import numpy as np

        img = mpimg.imread(str(png))  # H x W x 3|4, floats in [0, 1] for a PNG
        if img.dtype != np.uint8:
            img = (np.clip(img, 0.0, 1.0) * 255).round().astype(np.uint8)
        img = np.ascontiguousarray(img[..., :3])
        if self._tb is not None:
            self._tb.add_image(tag, img, step, dataformats="HWC")
            self._tb.flush()
        if self._wandb is not None:
            import wandb as wb

            self._wandb.log({tag: wb.Image(img, caption=Path(png).name)}, step=step)

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
