"""On a Ray cluster every worker must see the driver's run directory (``runtime.cluster.check_shared``): a node
whose workers do not (a run_dir on node-local disk) keeps their logs, said in one warning, and a run whose FSDP
ranks would each write their checkpoint shards into a directory the others do not see is refused at start."""

from __future__ import annotations

import pytest

from digenrl.config import ConfigError, load_config
from digenrl.control.run_plan import plan_run
from digenrl.runtime.cluster import SHARED_CHECK, check_shared, worker_log_dir
from digenrl.runtime.worker_base import WorkerBase


class _Nodes:
    """A stand-in for the actor pools: worker -> (its node, the folder it reads), each a directory of this
    machine, so that a worker on "another node" reads another folder (what it would see there)."""

    def __init__(self, views: dict[str, tuple[str, object]]):
        self.views = views

    def call(self, worker, method, path, token):
        assert method == "sees"
        node, folder = self.views[worker]
        seen = (folder / SHARED_CHECK).is_file() and (folder / SHARED_CHECK).read_text() == token
        return node, seen

    def get_named(self, refs, what, timeout_s=None):
        return list(refs.values())


def _run(tmp_path, *over):
    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", "runtime.mode=gap_tsp", "runtime.generators=1",
                             "runtime.trainers=2", *over])
    return plan_run(cfg)


def test_workers_that_share_the_run_dir_pass(tmp_path, capsys):
    run = _run(tmp_path, "train.sharding=fsdp")
    logs = worker_log_dir(run.cfg)
    check_shared(run, _Nodes({w: ("10.0.0.1", logs) for w in run.generator_ids + run.trainer_ids}), logs)
    assert capsys.readouterr().err == "" and list(logs.iterdir()) == []  # the token is gone once read


def test_a_node_without_the_run_dir_is_named_and_fsdp_is_refused(tmp_path, capsys):
    elsewhere = tmp_path / "node2"  # what node 10.0.0.2 sees at that path: its own (empty) folder
    elsewhere.mkdir()
    run = _run(tmp_path, "train.sharding=fsdp")
    logs = worker_log_dir(run.cfg)
    views = {"gen0": ("10.0.0.1", logs), "trn0": ("10.0.0.1", logs), "trn1": ("10.0.0.2", elsewhere)}
    with pytest.raises(ConfigError) as e:
        check_shared(run, _Nodes(views), logs)
    msg = str(e.value)
    assert msg.startswith(f"run_dir: {str(logs.parent)!r} is not the same directory on node 10.0.0.2 (trn1)")
    assert "train.sharding=fsdp" in msg and "every node mounts at the same path" in msg

    # replicated trainers send their checkpoint to the driver: only the logs stay apart, said once per node
    run = _run(tmp_path, "train.sharding=none")
    check_shared(run, _Nodes({**views, "gen0": ("10.0.0.3", elsewhere)}), logs)
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "node 10.0.0.3 (gen0); node 10.0.0.2 (trn1)" in err, err  # (workers in pool order)


def test_a_profile_log_folder_apart_is_not_refused(tmp_path, capsys):
    """``digenrl profile`` writes no checkpoint: its own log folder unshared is a warning even under FSDP."""
    run = _run(tmp_path, "train.sharding=fsdp")
    logs = tmp_path / "profile.logs"
    elsewhere = tmp_path / "node2"
    elsewhere.mkdir()
    check_shared(run, _Nodes({"gen0": ("10.0.0.1", logs), "trn0": ("10.0.0.1", logs),
                              "trn1": ("10.0.0.2", elsewhere)}), logs)
    assert "node 10.0.0.2 (trn1)" in capsys.readouterr().err


def test_a_worker_reads_the_token_back(tmp_path):
    (tmp_path / SHARED_CHECK).write_text("abc")
    node, seen = WorkerBase.sees(None, str(tmp_path / SHARED_CHECK), "abc")
    assert seen and node
    assert WorkerBase.sees(None, str(tmp_path / SHARED_CHECK), "abd")[1] is False  # a stale token: another run's
    assert WorkerBase.sees(None, str(tmp_path / "missing"), "abc")[1] is False


def test_a_failing_workers_log_on_another_node_is_pointed_to(tmp_path, capsys):
    from digenrl.cli import _print_worker_log

    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}"])
    _print_worker_log(cfg, "trn1")  # in-process (no logs/ folder): nothing to say
    assert capsys.readouterr().err == ""
    worker_log_dir(cfg).mkdir(parents=True)
    _print_worker_log(cfg, "trn1")
    assert f"stays on the worker's node, at {worker_log_dir(cfg) / 'trn1.log'}" in capsys.readouterr().err
