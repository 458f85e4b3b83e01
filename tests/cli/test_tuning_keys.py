"""The planner's outputs and expert knobs live in ``tuning:`` (issue 37 item 7); a config written before they moved
keeps loading: each old key is read in its new home with one notice on stderr, and a config that sets both names
of a key is refused naming both (exit 2, nothing written), a run resumed from an old run directory included.

Oracle: the old and new names written out by hand here (not read from ``config.load.MOVED``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from digenrl.cli import main
from digenrl.config import ConfigError, load_config

# old dotted key -> new dotted key, and a value other than the default for each
OLD_NEW = {"runtime.stale_hold": ("tuning.stale_hold", 0.5), "runtime.gang_groups": ("tuning.gang_groups", False),
           "runtime.tag_inference_copy": ("tuning.tag_inference_copy", True),
           "runtime.calibration.repeats": ("tuning.calibration_repeats", 5),
           "train.loss_scale_init": ("tuning.loss_scale_init", 1024.0),
           "runtime.bts.depth": ("tuning.bts.depth", 3), "runtime.bts.online": ("tuning.bts.online", False)}
USER = {"train": {"lr": 3e-4}, "runtime": {"mode": "gap", "generators": 2, "calibration": {"when": "never"}}}


def _tree(keys: dict) -> dict:
    """A config tree with the user's keys and ``keys`` (dotted -> value) set."""
    tree = json.loads(json.dumps(USER))
    for dotted, value in keys.items():
        *path, last = dotted.split(".")
        node = tree
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value
    return tree


def _write(path: Path, tree: dict) -> Path:
    path.write_text(yaml.safe_dump(tree))
    return path


def test_an_old_key_config_loads_to_the_new_key_config_with_one_notice_per_key(tmp_path, capsys):
    old = load_config(str(_write(tmp_path / "old.yaml", _tree({k: v for k, (_, v) in OLD_NEW.items()}))))
    notices = capsys.readouterr().err.splitlines()
    new = load_config(str(_write(tmp_path / "new.yaml", _tree({n: v for n, v in OLD_NEW.values()}))))
    assert capsys.readouterr().err == ""
    assert old.model_dump() == new.model_dump()
    t = new.tuning
    assert (t.stale_hold, t.gang_groups, t.tag_inference_copy, t.calibration_repeats, t.loss_scale_init,
            t.bts.depth, t.bts.online) == tuple(v for _, v in OLD_NEW.values())
    assert sorted(notices) == sorted(f"{o} is now {n} (read as such)" for o, (n, _) in OLD_NEW.items())
    assert (new.runtime.calibration.when, new.runtime.mode, new.train.lr) == ("never", "gap", 3e-4)


def test_an_old_key_override_is_read_as_the_new_key_and_wins_over_the_file(tmp_path, capsys):
    path = _write(tmp_path / "new.yaml", _tree({"tuning.stale_hold": 0.5, "tuning.bts.depth": 3}))
    cfg = load_config(str(path), ["runtime.stale_hold=4", "runtime.bts.max_branch=6"])
    assert (cfg.tuning.stale_hold, cfg.tuning.bts.depth, cfg.tuning.bts.max_branch) == (4.0, 3, 6)
    assert capsys.readouterr().err.splitlines() == ["runtime.stale_hold is now tuning.stale_hold (read as such)",
                                                    "runtime.bts.max_branch is now tuning.bts.max_branch (read as such)"]
    # an old file, a new override: the override wins, no conflict
    old = _write(tmp_path / "old.yaml", _tree({"train.loss_scale_init": 8.0}))
    assert load_config(str(old), ["tuning.loss_scale_init=16"]).tuning.loss_scale_init == 16.0


@pytest.mark.parametrize("old", sorted(OLD_NEW))
def test_a_config_setting_both_names_is_refused_naming_both(tmp_path, old):
    new, value = OLD_NEW[old]
    path = _write(tmp_path / "both.yaml", _tree({old: value, new: value}))
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert old in str(e.value) and new in str(e.value)
    with pytest.raises(ConfigError) as e:  # the same as two overrides
        load_config(None, [f"{old}={json.dumps(value)}", f"{new}={json.dumps(value)}"])
    assert old in str(e.value) and new in str(e.value)


def test_the_cli_refuses_both_names_with_exit_2_and_writes_nothing(tmp_path, capsys):
    path = _write(tmp_path / "both.yaml", {"runtime": {"stale_hold": 0.5}, "tuning": {"stale_hold": 1.0}})
    run = tmp_path / "run"
    assert main(["train", "--config", str(path), f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert "runtime.stale_hold" in err and "tuning.stale_hold" in err
    assert not run.exists()


# ---- a run directory written before the keys moved ---------------------------------------------------------------

TINY = ["train.prompts_per_step=2", "train.generations=4", "sampler.num_steps=4", "eval.num_prompts=4",
        "eval.grid_prompts=2", "eval.every=0", "log.progress=false", "runtime.checkpoint_every=2"]


def _to_old(cfg: dict) -> None:
    """``cfg`` (a config dict) as an older version wrote it: the tuning keys under their old names."""
    t = cfg.pop("tuning")
    cfg["runtime"].update(stale_hold=t["stale_hold"], gang_groups=t["gang_groups"],
                          tag_inference_copy=t["tag_inference_copy"], bts=t["bts"])
    cfg["runtime"]["calibration"]["repeats"] = t["calibration_repeats"]
    cfg["train"]["loss_scale_init"] = t["loss_scale_init"]


def _rewrite_checkpoint_config(path: Path, edit) -> None:
    """Edit the config recorded in a checkpoint's header (the data section, and so its content hash, unchanged)."""
    from digenrl.train.checkpoint import META_KEY

    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    meta = json.loads(header["__metadata__"][META_KEY])
    edit(meta["config"])
    header["__metadata__"][META_KEY] = json.dumps(meta)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def test_a_run_written_before_the_move_resumes_and_refuses_both_names(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", "steps=2", *TINY, "tuning.loss_scale_init=1024"]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    _to_old(saved)
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    for ckpt in (run / "checkpoints").glob("step_*.safetensors"):
        _rewrite_checkpoint_config(ckpt, _to_old)
    capsys.readouterr()
    # a math change through the old name is refused under the new one
    assert main(["train", "--resume", str(run), "steps=3", "train.loss_scale_init=8"]) == 2
    assert "tuning.loss_scale_init (checkpoint 1024.0, now 8.0)" in capsys.readouterr().err
    # both names in the run's config.yaml: refused naming both, nothing written
    both = dict(saved, tuning={"loss_scale_init": 1024.0})
    (run / "config.yaml").write_text(yaml.safe_dump(both, sort_keys=False))
    rows = (run / "metrics.jsonl").read_text()
    assert main(["train", "--resume", str(run), "steps=3"]) == 2
    err = capsys.readouterr().err
    assert "train.loss_scale_init" in err and "tuning.loss_scale_init" in err
    assert (run / "metrics.jsonl").read_text() == rows
    # the old config.yaml and checkpoint: the run goes on, with a notice per moved key
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    assert main(["train", "--resume", str(run), "steps=3"]) == 0
    err = capsys.readouterr().err
    assert "train.loss_scale_init is now tuning.loss_scale_init (read as such)" in err
    assert "runtime.bts.depth is now tuning.bts.depth (read as such)" in err
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward_mean" in r] == [1, 2, 3]
    assert yaml.safe_load((run / "config.yaml").read_text())["tuning"]["loss_scale_init"] == 1024.0


def test_a_resume_may_change_the_planner_outputs_but_not_the_loss_scale():
    """As under their old homes: the runtime's keys (stale hold, gang width, TAG copy, BTS, calibration) may change
    on resume; fp16's initial loss scale (a train key before) changes the step's math and is refused."""
    from digenrl.train.resume_config import check_resume_config

    saved = load_config(None, []).model_dump(mode="json")
    check_resume_config(saved, load_config(None, [f"{n}={json.dumps(v)}" for n, v in OLD_NEW.values()
                                                  if n != "tuning.loss_scale_init"]))
    with pytest.raises(ConfigError, match=r"tuning\.loss_scale_init \(checkpoint 65536.0, now 1024.0\)"):
        check_resume_config(saved, load_config(None, ["tuning.loss_scale_init=1024"]))


def test_a_saved_config_setting_both_names_refuses_the_resume_naming_both():
    """The config a checkpoint recorded, read as it was written: both names of a key refused, not compared."""
    from digenrl.train.resume_config import check_resume_config

    saved = load_config(None, []).model_dump(mode="json")
    saved["train"]["loss_scale_init"] = saved["tuning"]["loss_scale_init"]  # the same value: no math change
    with pytest.raises(ConfigError, match=r"^train\.loss_scale_init and tuning\.loss_scale_init: the checkpoint's "
                                          r"config sets both"):
        check_resume_config(saved, load_config(None, []))


def test_resume_auto_into_an_unfinished_run_whose_config_sets_both_names_exits_2(tmp_path, capsys):
    """resume=auto on a run stopped before its first checkpoint compares the run's config.yaml: one that sets both
    names of a key is refused as ``--resume`` refuses it (exit 2, naming both, nothing written)."""
    from digenrl.runtime.run_dir import MARKER, RUN_OUTPUTS

    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text(json.dumps({"program": "digenrl", "outputs": list(RUN_OUTPUTS)}))
    saved = load_config(None, [f"run_dir={run}", *TINY, "tuning.loss_scale_init=1024"]).model_dump(mode="json")
    saved["train"]["loss_scale_init"] = 1024.0
    _write(run / "config.yaml", saved)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    before = sorted((p.name, p.read_bytes()) for p in run.iterdir())
    capsys.readouterr()
    assert main(["train", f"run_dir={run}", "resume=auto", *TINY, "tuning.loss_scale_init=1024"]) == 2
    err = capsys.readouterr().err
    assert f"train.loss_scale_init and tuning.loss_scale_init: config file {str(run / 'config.yaml')!r} sets both" in err
    assert sorted((p.name, p.read_bytes()) for p in run.iterdir()) == before
