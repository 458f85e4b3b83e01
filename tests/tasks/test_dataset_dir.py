"""A Flow-GRPO dataset directory where a prompt file is expected (issue 24, item 2): ``dataset/ocr`` (train.txt,
test.txt) and ``dataset/geneval`` (train_metadata.jsonl, test_metadata.jsonl) as that repository ships them;
the test split is the eval set unless ``task.eval_prompts_file`` says otherwise; a directory with neither layout
is refused naming the key and what it looked for."""

from __future__ import annotations

import json

import pytest

from digenrl.config import ConfigError, TaskConfig, load_config
from digenrl.tasks.base import build_task
from digenrl.validate import check_task


def _ocr(root):
    d = root / "ocr"
    d.mkdir()
    (d / "train.txt").write_text('A sign that says "OPEN"\nA mug that reads "hello"\na red cat\n')
    (d / "test.txt").write_text('A poster reading "DigenRL"\n')
    return d


def _geneval(root):
    d = root / "geneval"
    d.mkdir()
    rows = [{"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
            {"tag": "counting", "include": [{"class": "dog", "count": 2}], "prompt": "a photo of two dogs"}]
    (d / "train_metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "test_metadata.jsonl").write_text(json.dumps(rows[1]) + "\n")
    return d


def test_ocr_layout(tmp_path):
    task = build_task(TaskConfig(name="text", prompts_file=str(_ocr(tmp_path))))
    assert [p.text for p in task.train] == ['A sign that says "OPEN"', 'A mug that reads "hello"', "a red cat"]
    assert [p.text for p in task.eval] == ['A poster reading "DigenRL"']


def test_geneval_layout_keeps_metadata(tmp_path):
    task = build_task(TaskConfig(name="text", prompts_file=str(_geneval(tmp_path))))
    assert [p.text for p in task.train] == ["a photo of a cat", "a photo of two dogs"]
    assert task.train[1].meta["include"] == [{"class": "dog", "count": 2}]
    assert [p.text for p in task.eval] == ["a photo of two dogs"]


def test_explicit_eval_file_wins(tmp_path):
    d = _ocr(tmp_path)
    ev = tmp_path / "ev.txt"
    ev.write_text("x\ny\n")
    task = build_task(TaskConfig(name="text", prompts_file=str(d), eval_prompts_file=str(ev)))
    assert [p.text for p in task.eval] == ["x", "y"]


def test_validate_accepts_dir_and_refuses_other_dirs(tmp_path):
    cfg = load_config(None, ["model.kind=sd3", "task.name=text", f"task.prompts_file={_ocr(tmp_path)}",
                             "train.prompts_per_step=3"])
    assert len(check_task(cfg, training=True)) == 4
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = cfg.model_copy(update={"task": TaskConfig(name="text", prompts_file=str(empty))})
    with pytest.raises(ConfigError, match="task.prompts_file: .*empty.* holds no train.txt or train_metadata.jsonl"):
        check_task(bad, training=True)
