"""The colocated baseline on the same workers (issue 37, one implementation per rule): `digenrl plan`'s colocated
comparison, `digenrl simulate --config`'s colocated row and `digenrl train`'s prediction build it one way
(``sim.config_source.colocated_on``) and price it one way (``colocated_source``).

Oracles: `digenrl simulate --config` run as its own command (``run_config_modes``), and the counts of the config
itself (GPUs = generators x generator degree + trainers)."""

import json

from digenrl.config import load_config
from digenrl.control.profile import load_profile
from digenrl.sim.config_source import run_config_modes
from digenrl.sim.plan_cli import main as plan_main
from digenrl.sim.prediction import predict
from digenrl.sim import presets

MIX = "configs/flux1_dev_mixgrpo.yaml"  # FLUX.1-dev, an FSDP trainer pool, at a small step
SMALL = ["train.prompts_per_step=3", "train.generations=4", "train.minibatches_per_step=1", "train.micro_batch=4",
         "sampler.num_steps=10"]


def test_plan_and_simulate_search_plan_one_colocated_baseline(tmp_path, capsys):
    """Two shard groups on 3 + 8 = 11 GPUs (2 does not divide 11) and a generator option: the baseline is one
    shard group on all 11 workers without the generator section. Before, `digenrl plan` refused the baseline
    (generator.dtype: colocated has no generator pool) and `digenrl simulate --config` exited 2 (the shard groups
    did not divide 11 workers)."""
    sets = SMALL + ["runtime.mode=gap_tsp", "runtime.generators=3", "runtime.trainers=8", "train.shard_groups=2",
                    "generator.dtype=float16"]
    argv = ["--config", MIX, "--testbed", "B", "--out", str(tmp_path / "plan.yaml"), "--json",
            *[a for kv in sets for a in ("--set", kv)]]
    assert plan_main(argv) == 0, capsys.readouterr().err
    rep = json.loads(capsys.readouterr().out)
    runs = run_config_modes(MIX, sets, ["gap_tsp"], testbed=presets.testbed_preset("B"), search_plan=True)
    co = runs["colocated"]
    assert (co.n_gen, co.n_train) == (0, 11)
    assert rep["colocated"]["step_time_s"] == co.search.best.step_time
    assert rep["colocated"]["label"] == co.search.best.candidate.label(co.search.best.plan)


def test_train_predicts_the_colocated_row_of_simulate(tmp_path):
    """A sequence-parallel generator pool (2 generators of 2 GPUs + 4 trainer ranks, FSDP): `digenrl train`'s
    prediction is colocated on all 8 GPUs, one worker per rank (the idealised colocated FSDP bound), the colocated
    row of `digenrl simulate --config --profile`. Before, it counted 6 workers and ran the pool as one shard
    group."""
    ops = {"denoise": [[1, 0.004], [4, 0.010]], "vae_decode": [[1, 0.001]], "reward": [[1, 0.0005]],
           "transfer": [[1, 0.0001]], "train_chunk": [[1, 0.006], [8, 0.03]], "allreduce": [[1, 0.004]],
           "optimizer": [[1, 0.003]], "publish": [[1, 0.002]], "tag_switch": [[1, 0.0]]}
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"format": "digenrl-profile", "version": 1, "trainers": 2, "ops": ops}))
    sets = ["steps=4", "train.prompts_per_step=2", "train.generations=4", "train.best_of_n=4", "sampler.num_steps=8",
            "runtime.mode=gap_tsp_tag", "runtime.generators=2", "runtime.generator_sequence_parallel.ulysses=2",
            "runtime.trainers=4"]
    pred = predict(load_config("configs/hunyuan_video.yaml", sets + [f"runtime.profile={prof}"]))
    runs = run_config_modes("configs/hunyuan_video.yaml", sets, ["gap_tsp_tag"], profile=load_profile(prof),
                            profile_trainers=2)
    co = runs["colocated"]
    assert pred["workers"] == co.n_train == 8
    assert len(co.plan.trainers) == 8  # one scheduler worker per rank
    assert pred["colocated_s"] == co.result.timing()["steady_step_time_s"]
