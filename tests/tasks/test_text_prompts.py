"""Prompt files: text and JSONL, deterministic per-step sampling, clear errors naming file and line."""

from __future__ import annotations

import pytest

from digenrl.config import TaskConfig
from digenrl.tasks.base import build_task
from digenrl.tasks.text_prompts import PromptFileError, TextPromptTask, read_prompt_file


def test_text_and_jsonl_files(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("a cat\n\n  a dog  \nthe photo\n")
    assert [(p.uid, p.text) for p in read_prompt_file(txt)] == [(0, "a cat"), (1, "a dog"), (2, "the photo")]
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"prompt": "one", "tag": "x"}\n\n{"prompt": "two"}\n')
    got = read_prompt_file(jl)
    assert [p.text for p in got] == ["one", "two"] and got[0].meta == {"tag": "x"} and got[1].uid == 1


@pytest.mark.parametrize(
    "content, line, what",
    [
        ('{"prompt": "ok"}\n{"prompt": \n', 2, "not valid JSON"),
        ('{"prompt": "ok"}\n\n["a"]\n', 3, "expected a JSON object"),
        ('{"text": "no prompt key"}\n', 1, 'field "prompt"'),
        ('{"prompt": "  "}\n', 1, 'field "prompt"'),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, content, line, what):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(PromptFileError, match=rf"bad.jsonl:{line}: .*{what}"):
        read_prompt_file(f)


def test_missing_empty_and_binary_files(tmp_path):
    with pytest.raises(PromptFileError, match="nope.txt.*does not exist"):
        read_prompt_file(tmp_path / "nope.txt")
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(PromptFileError, match="empty.txt.*no prompts"):
        read_prompt_file(tmp_path / "empty.txt")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(PromptFileError, match="bin.txt.*UTF-8"):
        read_prompt_file(tmp_path / "bin.txt")


def test_task_sampling_is_deterministic_and_distinct(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("\n".join(f"prompt {i}" for i in range(20)))
    ev = tmp_path / "e.txt"
    ev.write_text("eval a\neval b\n")
    task = build_task(TaskConfig(name="text", prompts_file=str(f), eval_prompts_file=str(ev)))
    assert isinstance(task, TextPromptTask)
    a, b = task.train_prompts(3, 8, seed=1), task.train_prompts(3, 8, seed=1)
    assert [p.uid for p in a] == [p.uid for p in b] and len({p.uid for p in a}) == 8
    assert [p.uid for p in task.train_prompts(4, 8, seed=1)] != [p.uid for p in a]
    assert all(p.text == f"prompt {p.uid}" for p in a)
    assert [p.text for p in task.eval_prompts(5)] == ["eval a", "eval b"]
    assert len(task.all_texts()) == 22
    with pytest.raises(ValueError, match="prompts_per_step=21"):
        task.train_prompts(0, 21, seed=0)
