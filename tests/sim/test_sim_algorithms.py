"""The simulator's per-algorithm work (``sim.algorithms``) against the code that does the work: MixGRPO's
window from ``algo.timesteps``, MixGRPO-Flash's schedule from ``algo.dpm``, and the roofline's training and
transfer terms against their formulas."""

from __future__ import annotations

from dataclasses import replace

import pytest

from digenrl.algo.dpm import post_window_sigmas
from digenrl.algo.timesteps import select_timesteps
from digenrl.sim import presets
from digenrl.sim.algorithms import Algorithm, AlgorithmError
from digenrl.sim.roofline import RooflineCost


@pytest.mark.parametrize("T,w,ratio", [(25, 4, 0.4), (20, 2, 0.5), (16, 3, 0.25)])
def test_flash_denoising_steps_are_the_mean_of_the_real_schedules(T, w, ratio):
    algo = Algorithm("mixgrpo", window=w, flash_ratio=ratio)
    lengths = []
    for k in range(0, 10_000):  # every window position of MixGRPO's progressive schedule, shift 1 / stride 1
        tp = select_timesteps(T, strategy="mixgrpo", window_size=w, seed=0, step=k, shift_interval=1, stride=1)
        last = max(tp.sde_steps)
        lengths.append(len(post_window_sigmas(T, last, 3.0, ratio)) - 1)
        if k and tp.sde_steps[0] == 0:  # the schedule rolled back: one full cycle seen
            lengths.pop()
            break
    assert algo.trained(T, 0.5) == w == len(tp.trained)
    assert algo.denoise_steps(T) == pytest.approx(sum(lengths) / len(lengths))
    assert algo.denoise_steps(T) < T
    assert Algorithm("mixgrpo", window=w).denoise_steps(T) == T  # plain MixGRPO: Euler ODE outside, every step


def test_trained_cells_per_algorithm():
    assert Algorithm().trained(20, 0.6) == 12 == Algorithm("grpo_guard").trained(20, 0.6)
    assert Algorithm("nft").trained(20, 0.6) == int(0.99 * 20) == 19  # DiffusionNFT's default K
    assert Algorithm("nft", nft_timesteps=5).trained(20, 0.6) == 5
    assert Algorithm("nft").trained(1, 0.6) == 1  # at least one slot, as the runtime's plan
    for bad in (dict(name="ppo"), dict(name="flow_grpo", flash_ratio=0.4), dict(name="mixgrpo", window=0),
                dict(name="flow_grpo", nft_timesteps=3)):
        with pytest.raises(AlgorithmError):
            Algorithm(**bad)
    with pytest.raises(AlgorithmError, match="--window"):
        Algorithm("mixgrpo", window=19).trained(20, 0.6)


def _cost(model, algo, n_gen=8, n_train=24):
    w = replace(presets.WORKLOADS[model], algorithm=algo)
    return RooflineCost(presets.model_preset(model), w, presets.testbed_preset("B"), n_gen, n_train)


def test_nft_trains_cfg_free_and_moves_only_x0():
    # Qwen-Image samples with true CFG (2 forwards per step): DiffusionNFT's cell is one forward + backward
    flow, nft = _cost("qwen_image", Algorithm()), _cost("qwen_image", Algorithm("nft", nft_old="current"))
    assert flow.model.forwards_per_step == 2
    assert nft.train_flops_per_cell() == pytest.approx(flow.train_flops_per_cell() / 2)
    assert nft.act_cell == pytest.approx(flow.act_cell / 2)
    assert nft._denoise(4, "generator") == flow._denoise(4, "generator")  # sampling is unchanged
    m, wl = flow.model, flow.workload
    sp = m.spec
    latent = sp.latent_channels * (wl.height // sp.spatial_down) * (wl.width // sp.spatial_down) * 2
    text = m.text_tokens * sp.text_dim * 2
    S = wl.trained_timesteps
    assert flow.trajectory_bytes() == 2 * S * latent + 4 * S + text
    assert nft.trajectory_bytes() == latent + text
    guard = _cost("qwen_image", Algorithm("grpo_guard"))
    assert guard.trajectory_bytes() == 3 * S * latent + 4 * S + text


def test_config_path_prices_the_configs_algorithm(tmp_path):
    """`simulate --config` with MixGRPO-Flash: the priced plan samples the compressed schedule's steps and
    trains the window."""
    from digenrl.sim.config_source import run_config_modes

    sets = ["train.algorithm=mixgrpo", "train.window_size=4", "sampler.num_steps=25", "sampler.post_solver=dpmpp_2m",
            "sampler.post_compress_ratio=0.4", "sampler.static_shift=3", "steps=2"]
    runs = run_config_modes("configs/flux1_dev.yaml", sets, ["gap_tsp"], testbed=presets.testbed_preset("B"))
    plan = runs["gap_tsp"].plan
    assert plan.trained_timesteps == 4
    assert plan.sampling_steps == round(Algorithm("mixgrpo", window=4, flash_ratio=0.4).denoise_steps(25)) < 25


@pytest.mark.parametrize("model,training", [("qwen_image", {}), ("flux", {}), ("flux", {"sharded": False, "lora_rank": 32})])
def test_nft_soft_old_policy_adds_a_forward_per_cell_and_the_copys_updates(model, training):
    """train.nft_old_policy=soft over current: + F per cell (the no-grad v_old forward), + one all-gather per
    chunk under FSDP, + 48 bytes per rank trainable parameter per chunk (two in-place exchanges, 3 copies each,
    read + write, fp32) and + 20 per commit (the soft update) at HBM bandwidth."""
    def cost(old):
        w = presets.WORKLOADS[model]
        w = replace(w, algorithm=Algorithm("nft", nft_old=old))
        w = replace(w, training=replace(w.training, **training))
        return RooflineCost(presets.model_preset(model), w, presets.testbed_preset("B"), 8, 24)

    soft, cur = cost("soft"), cost("current")
    sharded = soft.sharded
    assert soft.train_flops_per_cell() - cur.train_flops_per_cell() == pytest.approx(soft.fwd_flops)
    hbm = soft.gpu["trainer"].hbm_gbs * 1e9
    n = max(1, soft.n_train) if sharded else 1
    local = soft.trainable / n if sharded and not soft.lora else soft.trainable
    assert soft._optimizer(1, "trainer") - cur._optimizer(1, "trainer") == pytest.approx(20 * local / hbm)
    c = 4
    comp = soft._compute(c * soft.train_flops_per_cell(), c * soft.train_fps * soft.seq, "trainer")
    comm, x = 3 * soft.gather_s + soft.scatter_s, 0.1  # overlapped but for the exposed share (sim.comm)
    want = x * comm + max(comp, (1 - x) * comm) + 3 * soft.eff.overhead_s + 48 * local / hbm
    assert soft._train_chunk(c * n, "trainer") == pytest.approx(want)
    assert soft._train_chunk(c * n, "trainer") > cur._train_chunk(c * n, "trainer")
