"""A full disk names the file it could not write (issue 40): the write of a checkpoint's temp file raises ENOSPC
as ``write(2)`` does, with no file name; the run stops with exit 74 (EX_IOERR) and a line naming the checkpoint
it was writing, the earlier checkpoint whole."""

from __future__ import annotations

import errno
import json
from pathlib import Path

from digenrl.cli import main

TINY = ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4", "eval.num_prompts=4",
        "eval.grid_prompts=4", "eval.every=0", "log.progress=false"]


def test_disk_full_line_names_the_file(tmp_path, capsys, monkeypatch):
    real = Path.write_bytes

    def full(self, data):
        if self.name.startswith(".tmp-step_00000002"):
            raise OSError(errno.ENOSPC, "No space left on device")  # write(2) on a full disk: no file name
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", "steps=3", *TINY, "runtime.checkpoint_every=1"]) == 74
    err = capsys.readouterr().err
    want = str(run / "checkpoints" / "step_00000002.safetensors")
    assert "No space left on device" in err and want in err and ".tmp-" not in err, err
    assert json.loads((run / "failure.json").read_text())["error"].endswith(want)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000001.safetensors"]


def test_metrics_write_on_a_full_disk_names_the_file(tmp_path):
    import pytest

    from digenrl.observe.metrics import MetricsWriter

    w = MetricsWriter(tmp_path)

    class Full:
        name = str(w.path)

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

    w._fh.close()
    w._fh = Full()
    with pytest.raises(OSError) as e:
        w.log({"step": 1, "reward_mean": 0.5})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "metrics.jsonl")
