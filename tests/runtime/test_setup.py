"""The runtime's config checks, plan, placement checks and weight staging (no Ray needed)."""

from __future__ import annotations

import pytest
from runtime_helpers import make_cfg

from digenrl.config import ConfigError


@pytest.mark.parametrize("mode", ["gap", "gap_tsp", "gap_tsp_tag", "full"])
@pytest.mark.parametrize("option", ["train.std_mode=global", "train.adv_baseline=batch"])
def test_step_wide_advantages_in_pipelined_modes_make_a_step_wide_plan(tiny_model, tmp_path, mode, option):
    """Accepted (a provisional scale rescaled at the commit) with several epochs and several minibatches: the
    plan is step-wide, so its commits wait for the step's last reward (tests/schedule/test_step_wide.py)."""
    from digenrl.control.run_plan import plan_run

    assert plan_run(make_cfg(tiny_model, tmp_path, f"runtime.mode={mode}", option, "train.inner_epochs=2")).plan.rounds == 2
    plan = plan_run(make_cfg(tiny_model, tmp_path, f"runtime.mode={mode}", option, "train.minibatches_per_step=2")).plan
    assert plan.step_wide and plan.rounds == 2
    assert not plan_run(make_cfg(tiny_model, tmp_path, f"runtime.mode={mode}")).plan.step_wide


@pytest.mark.parametrize("mode", ["naive", "colocated"])
def test_global_std_allowed_in_barrier_modes(tiny_model, tmp_path, mode):
    from digenrl.control.run_plan import plan_run

    setup = plan_run(make_cfg(tiny_model, tmp_path, f"runtime.mode={mode}", "train.std_mode=global"))
    assert setup.plan.mode.value == mode


def test_plan_from_config(tiny_model, tmp_path):
    from digenrl.control.run_plan import plan_run

    setup = plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=full", "runtime.generators=2",
                                  "runtime.trainers=3", "runtime.fragment_size=9", "train.timestep_fraction=0.5",
                                  "runtime.max_stale_fraction=0.5"))
    p = setup.plan
    assert p.generators == ("gen0", "gen1") and p.trainers == ("trn0", "trn1", "trn2")
    assert (p.prompts, p.generations, p.fragment_size, p.trained_timesteps, p.sampling_steps) == (2, 4, 4, 2, 4)
    assert p.stale_cap == 4  # floor(0.5 * B), B = 2 x 4
    col = plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=colocated", "runtime.trainers=2")).plan
    assert col.generators == () and col.trainers == ("col0", "col1")
    with pytest.raises(ConfigError, match=r"^runtime\.generators"):
        plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=colocated", "runtime.generators=2"))


@pytest.mark.parametrize("spec", ["gen9@1", "gen0@x", "gen0@1:boom", "gen0", "gen0@0"])  # steps from 1
def test_bad_failure_hook(tiny_model, tmp_path, spec, monkeypatch):
    from digenrl.control.run_plan import plan_run

    monkeypatch.setenv("DIGENRL_TEST_HOOKS", f"inject_failure={spec}")
    with pytest.raises(ConfigError, match=r"^DIGENRL_TEST_HOOKS: inject_failure"):
        plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap"))


@pytest.mark.parametrize("text", ["logprob_offset=x", "inject_failure", "boom=1"])
def test_bad_test_hooks_name_the_variable(tiny_model, tmp_path, text, monkeypatch):
    from digenrl.control.run_plan import plan_run

    monkeypatch.setenv("DIGENRL_TEST_HOOKS", text)
    with pytest.raises(ConfigError, match=r"^DIGENRL_TEST_HOOKS: "):
        plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap"))


def test_test_hooks_are_read_from_the_environment_not_the_config(tiny_model, tmp_path, monkeypatch):
    from digenrl.config import Config
    from digenrl.control.run_plan import TestHooks, plan_run

    assert not [k for k in Config.model_json_schema()["$defs"]["RuntimeConfig"]["properties"] if "inject" in k]
    with pytest.raises(ConfigError, match="inject_failure"):
        make_cfg(tiny_model, tmp_path, "runtime.mode=gap", "runtime.inject_failure=gen0@1")
    assert plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap")).hooks is None
    monkeypatch.setenv("DIGENRL_TEST_HOOKS", "inject_failure=gen0@1:exit; logprob_offset=0.5")
    hooks = plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap")).hooks
    assert hooks == TestHooks("gen0", 1, "exit", 0.5) and hooks.without_failure() == TestHooks(logprob_offset=0.5)


def test_missing_resource_label_is_refused(tiny_model, tmp_path):
    from digenrl.runtime.cluster import actor_options, check_resources, pool_demand
    from digenrl.control.run_plan import plan_run

    cfg = make_cfg(tiny_model, tmp_path, "runtime.mode=gap", "runtime.generators=2",
                   "runtime.generator_resources={L40S: 1}", "runtime.trainer_resources={H100: 1, CPU: 2}")
    setup = plan_run(cfg)
    assert pool_demand(cfg, "trainer") == {"CPU": 2.0, "GPU": 0.0, "H100": 1.0}
    assert actor_options(pool_demand(cfg, "generator")) == {"num_cpus": 1.0, "num_gpus": 0.0,
                                                            "resources": {"L40S": 1.0}}
    check_resources(setup, {"CPU": 4.0, "L40S": 2.0, "H100": 1.0})  # fits
    with pytest.raises(ConfigError, match=r"^runtime\.generator_resources: .*'L40S'"):
        check_resources(setup, {"CPU": 4.0, "L40S": 1.0, "H100": 1.0})
    with pytest.raises(ConfigError, match=r"^runtime\.trainer_resources: .*'H100'"):
        check_resources(setup, {"CPU": 4.0, "L40S": 2.0})
    with pytest.raises(ConfigError, match=r"^runtime\.trainer_resources: .*4 x 'CPU'"):
        check_resources(setup, {"CPU": 3.0, "L40S": 2.0, "H100": 1.0})


def test_bad_profile_path_is_a_config_error(tiny_model, tmp_path):
    from digenrl.control.run_plan import plan_run

    with pytest.raises(ConfigError, match=r"^runtime\.profile"):
        plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap_tsp_tag", f"runtime.profile={tmp_path}/no.json"))


def test_tag_mode_without_any_cost_model_is_refused(tiny_model, tmp_path):
    from digenrl.control.run_plan import plan_run

    with pytest.raises(ConfigError, match=r"^runtime\.calibration\.when: 'never' .*'gap_tsp_tag'"):
        plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap_tsp_tag", "runtime.calibration.when=never"))
    plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=gap_tsp", "runtime.calibration.when=never"))  # no BTS


def test_weight_inbox_hands_over_whole_versions():
    from digenrl.runtime.publish import WeightInbox

    box = WeightInbox()
    box.put(1, {"w": 1})
    box.put(2, {"w": 2})
    assert box.take(3) is None and box.versions() == []  # never received: refused, older ones dropped
    box.put(4, {"w": 4})
    assert box.take(4) == {"w": 4} and box.versions() == []


def test_atomic_write_replaces_whole_file(tmp_path):
    from digenrl.safe_files import atomic_write_bytes

    p = tmp_path / "checkpoint.safetensors"
    atomic_write_bytes(p, b"old")
    atomic_write_bytes(p, b"new")
    assert p.read_bytes() == b"new" and [f.name for f in tmp_path.iterdir()] == ["checkpoint.safetensors"]


def test_cli_refuses_before_writing(tiny_model, tmp_path):
    from digenrl.cli import main

    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", f"model.path={tiny_model}", "runtime.mode=gap",
                 "train.minibatch_split=samples"]) == 2  # sample minibatches run in the barrier modes only
    assert not run.exists()


def test_run_refuses_unplaceable_pools_before_writing(ray_local, tiny_model, tmp_path):
    from digenrl.runtime.driver import run_training

    run = tmp_path / "run"
    cfg = make_cfg(tiny_model, run, "runtime.mode=gap", "runtime.generator_resources={A100: 1}")
    with pytest.raises(ConfigError, match=r"^runtime\.generator_resources: .*'A100'"):
        run_training(cfg, ray=True)
    assert not run.exists()


def test_plan_of_a_stream_publish(tiny_model, tmp_path):
    from digenrl.control.run_plan import plan_run

    p = plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=full", "runtime.publish=stream")).plan
    assert p.publish_streams and p.publish_joins
    b = plan_run(make_cfg(tiny_model, tmp_path, "runtime.mode=full", "runtime.publish=broadcast")).plan
    assert b.publish_joins and not b.publish_streams
    with pytest.raises(ConfigError, match=r"runtime\.publish"):
        make_cfg(tiny_model, tmp_path, "runtime.publish=streams")


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 32])
@pytest.mark.parametrize("senders", [1, 2, 3, 4])
def test_stream_shard_shapes_are_torch_chunk_parts(rows, senders):
    """Each sender's part of a (rows, 3) tensor is its ``torch.chunk`` part along dim 0 (FSDP2's split; ranks
    past the last chunk hold 0 rows), and the parts join back to the tensor."""
    import torch

    from digenrl.runtime.publish import shard_shape

    t = torch.arange(rows * 3.0).reshape(rows, 3)
    chunks = list(torch.chunk(t, senders, dim=0))
    chunks += [t[:0]] * (senders - len(chunks))
    assert [shard_shape(t.shape, senders, i) for i in range(senders)] == [tuple(c.shape) for c in chunks]
    assert torch.equal(torch.cat(chunks), t)
