"""Issue 38's smaller items: the eval's prompt set said at start, intermediate eval grids in run_dir/samples/,
``runtime.mode`` as its plain name (reward curve title), ``--overwrite`` removing the old run's wandb/, and the
step numbering of trajectories.jsonl (metrics.jsonl's: from 1)."""

from __future__ import annotations

import json

from digenrl.cli import main
from digenrl.config import load_config

TINY = ["log.progress=false", "train.prompts_per_step=2", "train.generations=2", "eval.num_prompts=2",
        "eval.grid_prompts=2", "sampler.num_steps=2"]


def test_eval_prompt_warnings(tmp_path):
    from digenrl.validate import eval_warnings

    assert eval_warnings(load_config(None, [])) == []  # the demo: 64 of its 120 prompts
    (w,) = eval_warnings(load_config(None, ["eval.num_prompts=500"]))
    assert w == "eval.num_prompts: 500, but the digits task has 120 prompts: each eval uses those 120"
    train = tmp_path / "train.txt"
    train.write_text("a cat\na dog\na red cat\n")
    text = ["task.name=text", f"task.prompts_file={train}", "model.kind=sd3"]
    got = eval_warnings(load_config(None, text))
    assert got[0].startswith("task.eval_prompts_file: not set, so the eval scores the first train prompts")
    assert got[1] == f"eval.num_prompts: 64, but task.prompts_file '{train}' has 3 prompts: each eval uses those 3"
    held = tmp_path / "test.txt"
    held.write_text("\n".join(f"prompt {i}" for i in range(64)))
    assert eval_warnings(load_config(None, [*text, f"task.eval_prompts_file={held}"])) == []


def test_train_prints_the_eval_warning(tmp_path, capsys):
    rc = main(["train", f"run_dir={tmp_path / 'run'}", "steps=2", "eval.every=1", *TINY, "eval.num_prompts=500"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "digenrl: warning: eval.num_prompts: 500, but the digits task has 120 prompts" in err
    run = tmp_path / "run"
    assert (run / "samples" / "eval_step_1.png").is_file()  # the intermediate eval's grid, in the run dir
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 2]  # eval before RL, then steps from 1 (and the final eval row)
    assert json.loads((run / "summary.json").read_text())["mode"] == "colocated"


def test_mode_is_its_plain_name():
    cfg = load_config(None, [])
    assert type(cfg.runtime.mode) is str and f"{cfg.runtime.mode}" == "colocated"  # not Mode.COLOCATED


def test_overwrite_removes_the_old_wandb_dir(tmp_path):
    from digenrl.runtime.run_dir import clear_previous_run, write_marker

    run = tmp_path / "run"
    (run / "wandb" / "offline-run-1").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "samples").mkdir()
    write_marker(run)
    clear_previous_run(run)
    assert not (run / "wandb").exists() and not (run / "logs").exists() and not (run / "samples").exists()
