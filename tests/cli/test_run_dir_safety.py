"""``run_dir`` cannot destroy what the program did not write: an empty, ``.``, ``/`` or home-directory run_dir is
refused; ``--overwrite`` deletes only a directory marked (``.digenrl-run``) as a run of this program and only its
outputs; a second writer into a run_dir in use (an exclusive lock, ``.digenrl-lock``) is refused at once (exit 2)."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest

from digenrl.cli import main

FAST = ["steps=1", "train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4", "eval.num_prompts=4",
        "eval.grid_prompts=2", "eval.every=0", "log.progress=false"]
MARKER, LOCK = ".digenrl-run", ".digenrl-lock"


def snapshot(root: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.rglob("*"))}


def _someones_files(d: Path) -> Path:
    """A directory that looks like a run (config.yaml, checkpoints/, tensorboard/) but is not one of ours."""
    (d / "checkpoints").mkdir(parents=True)
    (d / "checkpoints" / "mine.bin").write_bytes(b"x")
    (d / "tensorboard").mkdir()
    (d / "config.yaml").write_text("my: own\n")
    (d / "notes.txt").write_text("keep me\n")
    return d


@pytest.mark.parametrize("value", ["", ".", "./", "/", "'~'", "HOME", "../cwd"])
def test_unsafe_run_dirs_are_refused(tmp_path, capsys, monkeypatch, value):
    import digenrl.runtime.run_dir as rd
    import digenrl.runtime.run_outputs as ro

    def never(*a, **k):  # should the refusal regress, this test still writes nothing (not even into /)
        raise AssertionError("the run reached its run_dir")

    for mod in (rd, ro):  # where the CLI and ``RunOutputs`` take them from
        for name in ("lock_run_dir", "prepare_run_dir", "clear_previous_run"):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, never)
    cwd, home = _someones_files(tmp_path / "cwd"), _someones_files(tmp_path / "home")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    if value == "HOME":
        value = str(home)
    before = snapshot(tmp_path)
    assert main(["train", "--overwrite", f"run_dir={value}", *FAST]) == 2
    err = capsys.readouterr().err
    assert err.startswith("digenrl: error: run_dir") and len(err.strip().splitlines()) == 1, err
    assert snapshot(tmp_path) == before


def test_overwrite_refuses_a_directory_this_program_did_not_mark(tmp_path, capsys):
    d = _someones_files(tmp_path / "other")
    before = snapshot(tmp_path)
    assert main(["train", "--overwrite", f"run_dir={d}", *FAST]) == 2
    err = capsys.readouterr().err
    assert "run_dir" in err and str(d) in err and MARKER in err, err
    assert snapshot(tmp_path) == before


def test_overwrite_removes_only_the_outputs_of_a_marked_run(tmp_path):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *FAST]) == 0
    assert (run / MARKER).is_file() and (run / "checkpoint.safetensors").is_file()
    (run / "notes.txt").write_text("mine\n")  # added by the user after the run
    assert main(["train", "--overwrite", f"run_dir={run}", *FAST]) == 0
    assert (run / "notes.txt").read_text() == "mine\n" and (run / MARKER).is_file()
    assert (run / "summary.json").is_file()


def test_resume_auto_does_not_clear_an_unmarked_directory(tmp_path, capsys):
    d = tmp_path / "other"
    d.mkdir()
    (d / "metrics.jsonl").write_text("{}\n")  # looks like a run killed before its first checkpoint
    (d / "notes.txt").write_text("keep me\n")
    before = snapshot(tmp_path)
    assert main(["train", "resume=auto", f"run_dir={d}", *FAST]) == 2
    assert MARKER in capsys.readouterr().err and snapshot(tmp_path) == before


def test_a_second_writer_is_refused_at_once(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(120)",
                               str(run / LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["train", "--overwrite", f"run_dir={run}", *FAST]) == 2
        err = capsys.readouterr().err
        assert "run_dir" in err and "in use" in err and str(run) in err, err
        assert sorted(p.name for p in run.iterdir()) == [LOCK]
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_is_held_for_the_whole_run(tmp_path, monkeypatch):
    from digenrl.runtime.trainer import TrainerWorker

    run = tmp_path / "run"
    seen = []
    train = TrainerWorker.train

    def probe(self, *args):
        with open(run / LOCK, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append("free")
                fcntl.flock(f, fcntl.LOCK_UN)
            except BlockingIOError:
                seen.append("held")
        return train(self, *args)

    monkeypatch.setattr(TrainerWorker, "train", probe)
    assert main(["train", f"run_dir={run}", *FAST]) == 0
    assert seen and set(seen) == {"held"}
    with open(run / LOCK, "a") as f:  # released at the end
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
