"""The I1 reference: a config's steps in one process, one step after the other, written from the formulas.

    for each step k:
        prompts <- task(k); trajectories <- sample(policy_k (DiffusionNFT soft: its old copy), prompts x G)
        rewards <- reward(decode(x_0)); A <- group-relative advantages (formulas.advantages)
        rows that train: best-of-n, then A != 0 (the filter) or Flow-GRPO's refill
        for each inner epoch, for each minibatch (groups by index, a seeded split of the samples, or MixGRPO's
                block of every group's generations):
            for each trained position j: one forward of the round's rows at j, backward of
                sum_rows [policy term + beta KL] / S          (clipped ratio, GRPO-Guard or DiffusionNFT;
                per-reward advantages: DanceGRPO's sum of losses or MixGRPO's clamped sum of advantages)
            grads /= rows of the round; clip; AdamW step;  EMA (k updates), DiffusionNFT's old copy (last round)

It shares with the product only its inputs: the model (``models``), the task, the reward, the sampler that
records the trajectories (``rollout``: the generators' code and I5's noise; its own oracles are
``tests/rollout``) and the config's timestep plan. No chunking (GRPO-Guard's batch bias alone reads the chunk
shape: which rows one forward holds, ``_forwards``), no masks, no loss-scale object, no transaction:
the product's ``train/step_math.py``, ``loss_scale.py``, ``chunk_loss.py``, ``sample_masks.py`` and
``algo/advantage.py``, ``loss.py``, ``sde.py``, ``guard.py``, ``nft.py`` are not imported (``test_i1_in_process.py``
checks it), so an error in them shows against this file.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch

from . import formulas as F


def sampler_settings(cfg):
    """The sampler's settings for a config (what the generators sample with)."""
    from digenrl.rollout.sampler import SamplerSettings

    s, alg = cfg.sampler, cfg.train.algorithm
    return SamplerSettings(num_steps=s.num_steps, noise_level=s.noise_level, kind=s.kind, cfg_scale=s.cfg_scale,
                           eval_cfg_scale=s.eval_cfg_scale, same_latent=s.same_latent, static_shift=s.static_shift,
                           integer_timesteps=s.integer_timesteps in (True, "sampling"), record_means=alg == "grpo_guard",
                           record_cells=alg != "nft", ode_solver=s.nft_solver if alg == "nft" else "euler",
                           post_solver=s.post_solver, post_compress_ratio=s.post_compress_ratio)


class Reference:
    """One run of ``cfg`` (``policy`` / ``reward`` / ``task``: objects instead of the config's)."""

    def __init__(self, cfg, *, policy=None, reward=None, task=None):
        from digenrl.models.registry import build_policy
        from digenrl.rewards.registry import build_weighted
        from digenrl.tasks.base import build_task

        torch.manual_seed(cfg.seed)
        self.cfg, t = cfg, cfg.train
        self.task = task if task is not None else build_task(cfg.task)
        self.policy = policy if policy is not None else build_policy(cfg.model)
        self.reward = reward if reward is not None else build_weighted(cfg.reward)
        self.ref = None
        if t.beta_kl > 0:
            self.ref = self.policy.make_reference() if hasattr(self.policy, "make_reference") else \
                copy.deepcopy(self.policy).requires_grad_(False).eval()
        self.named = {n: p for n, p in self.policy.named_parameters() if p.requires_grad}
        self.opt = torch.optim.AdamW(list(self.named.values()), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay,
                                     eps=t.adam_epsilon)
        self.ema = None if t.ema_decay is None else self._copy()
        self.old = self._copy() if t.algorithm == "nft" and t.nft_old_policy == "soft" else None
        self.commits = 0
        self.sampler = sampler_settings(cfg)

    def _copy(self) -> dict:
        return {n: p.detach().clone() for n, p in self.named.items()}

    @contextmanager
    def holding(self, weights: dict | None):
        """The policy holds ``weights`` (trainable tensors) inside the block, its own after."""
        if weights is None:
            yield
            return
        mine = self._copy()
        with torch.no_grad():
            for n, p in self.named.items():
                p.copy_(weights[n])
        try:
            yield
        finally:
            with torch.no_grad():
                for n, p in self.named.items():
                    p.copy_(mine[n])

    def state(self, eval_weights: bool = False) -> dict:
        """The policy's state dict (``eval_weights``: with the EMA's values, as the run's final checkpoint)."""
        with self.holding(self.ema if eval_weights else None):
            return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    # ---- a step ------------------------------------------------------------------------------------------
    def sample(self, k: int):
        from digenrl.control.run_plan import timestep_plan
        from digenrl.rollout.records import TrajectoryBatch
        from digenrl.rollout.sampler import sample_trajectories

        cfg, t = self.cfg, self.cfg.train
        prompts = self.task.train_prompts(k, t.prompts_per_step, cfg.seed)
        rep = [p for p in prompts for _ in range(t.generations)]
        gens = [g for _ in prompts for g in range(t.generations)]
        parts = []
        with self.holding(self.old):  # DiffusionNFT samples with its old copy
            for i in range(0, len(rep), 64):  # (the generators' batches)
                b = sample_trajectories(self.policy, rep[i:i + 64], gens[i:i + 64], step=k, run_seed=cfg.seed,
                                        version=k, settings=self.sampler, plan=timestep_plan(cfg, k))
                b.rewards, b.reward_parts = self.reward.score(b.images, b.prompts)
                parts.append(b)
        return TrajectoryBatch.cat(parts)

    def step(self, k: int) -> dict:
        """Step ``k``; returns its metrics (``reward_mean``, ``loss``, ``kl``, ``approx_kl``, ``kept_fraction``)."""
        cfg, t = self.cfg, self.cfg.train
        P, G, M = t.prompts_per_step, t.generations, t.minibatches_per_step
        batch = self.sample(k)
        rewards = [batch.rewards[g * G:(g + 1) * G].tolist() for g in range(P)]
        parts = {n: [v[g * G:(g + 1) * G].tolist() for g in range(P)] for n, v in (batch.reward_parts or {}).items()}
        adv = F.per_reward_advantages(parts, t) if t.adv_per_reward else F.advantages(rewards, t)
        weights = {n: float(o.get("weight", 1.0)) for n, o in cfg.reward.items()} if t.adv_per_reward else None
        sel = [F.best_of_n(rewards[g], t.best_of_n, t, {n: v[g] for n, v in parts.items()}, weights)
               if t.best_of_n else list(range(G)) for g in range(P)]
        if t.zero_adv_refill:
            keep = F.refill([adv[g][sel[g]] for g in range(P)], P * G // t.micro_batch, cfg.seed, k)
            kept = [[r for r, on in zip(sel[g], keep[g].tolist()) if on] for g in range(P)]
        elif t.filter_zero_advantage:
            kept = [[r for r in sel[g] if bool(F.nonzero(adv[g][r:r + 1]))] for g in range(P)]
        else:
            kept = sel
        start = self._copy() if t.old_logprob == "recompute" else None  # the step's starting weights
        sums = dict(loss=0.0, kl=0.0, approx_kl=0.0, cells=0, kept=0)
        for e in range(t.inner_epochs):
            if t.minibatch_split == "samples":
                rounds = F.sample_minibatches(kept, M, cfg.seed, k, e)
            elif t.minibatch_split == "generations":
                rounds = [{(g, r) for g in range(P) for r in kept[g] if r in block}
                          for block in F.generation_minibatches(G, M)]
            else:
                rounds = [{(g, r) for g in groups for r in kept[g]} for groups in F.group_minibatches(P, M)]
            for m, members in enumerate(rounds):
                rows = sorted(g * G + r for g, r in members)
                self._train(batch, rows, adv, start, first=e == 0 and m == 0, sums=sums)
                sums["kept"] += len(rows) if e == 0 else 0
                self._commit(len(rows), final=e == t.inner_epochs - 1 and m == M - 1)
        n = max(sums["cells"], 1)
        r = batch.rewards.float()
        return {"reward_mean": float(r.mean()), "reward_std": float(r.std(unbiased=False)),
                "loss": sums["loss"] / n, "kl": sums["kl"] / n, "approx_kl": sums["approx_kl"] / n,
                "kept_fraction": sums["kept"] / (P * G)}

    def _commit(self, kept: int, final: bool) -> None:
        """(1 / kept) of the accumulated gradient, the clip, one AdamW step; then the EMA and the old copy."""
        t = self.cfg.train
        for p in self.named.values():
            if p.grad is not None:
                p.grad.mul_(1.0 / max(kept, 1))
        torch.nn.utils.clip_grad_norm_(list(self.named.values()),
                                       t.max_grad_norm if t.max_grad_norm is not None else float("inf"))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.commits += 1
        n = self.commits
        if self.ema is not None and (n + 1) % t.ema_every == 0:
            d = F.ema_decay(n, t.ema_decay, t.ema_warmup)
            k = t.prompts_per_step * t.generations // (t.minibatches_per_step * t.micro_batch) \
                if t.ema_update == "per_micro_batch" else 1
            for _ in range(k):
                for name, p in self.named.items():
                    self.ema[name] += (1 - d) * (p.detach() - self.ema[name])
        if self.old is not None and final:
            d = F.old_decay(n, *t.nft_old_decay)
            for name, p in self.named.items():
                self.old[name] = d * self.old[name] + (1 - d) * p.detach()

    def _velocity(self, x, sigma, cond, cfg_scale: float, policy=None):
        from digenrl.models.base import guided_velocity

        s, t = self.cfg.sampler, self.cfg.train
        return guided_velocity(self.policy if policy is None else policy, x, sigma, cond, cfg_scale, guidance=s.cfg_scale,
                               detach_uncond=t.cfg_detach_uncond,
                               integer_timesteps=s.integer_timesteps is True)  # "sampling": float time here

    def _train(self, batch, rows, adv, start, *, first: bool, sums: dict) -> None:
        """Accumulate the gradient of sum_rows sum_j L(row, j) / S, one forward per trained position j."""
        if not rows:
            return
        t, G = self.cfg.train, self.cfg.train.generations
        a = torch.stack([adv[i // G][i % G] for i in rows])
        cond = self.policy.encode_prompts([batch.prompts[i] for i in rows])
        S = len(batch.trained_steps)
        for j in range(S):
            if t.algorithm == "nft":
                loss, klv, akl = self._nft_cells(batch, rows, j, a, cond)
            else:
                loss, klv, akl = self._sde_cells(batch, rows, j, a, cond, start, first)
            total = loss + t.beta_kl * klv
            (total.sum() / S).backward()
            sums["loss"] += float(total.detach().sum())
            sums["kl"] += float(klv.detach().sum())
            sums["approx_kl"] += float(akl.sum())
            sums["cells"] += len(rows)

    def _sde_cells(self, batch, rows, j, a, cond, start, first: bool):
        """(policy term, KL, 0.5 (log r)^2) of the rows at trained position j (Flow-GRPO / DanceGRPO / CPS,
        GRPO-Guard's normalised ratio, the recomputed logp_old and its truncated weight)."""
        s, t = self.cfg.sampler, self.cfg.train
        x, xn = batch.latents[rows, j], batch.next_latents[rows, j]
        step = int(batch.trained_steps[j])
        sigma, sigma_n = batch.sigmas[step].expand(len(rows)), batch.sigmas[step + 1].expand(len(rows))
        cfg_scale = s.cfg_scale if t.cfg_in_training else 1.0
        logp_gen = batch.log_probs[rows, j]
        logp_start = None
        if start is not None and not first:  # a later round: logp_old under the step's starting weights
            with torch.no_grad(), self.holding(start):
                v0 = self._velocity(x, sigma, cond, cfg_scale)
                logp_start = F.sde_step(x, v0, sigma, sigma_n, s.kind, s.noise_level)[3](xn)
        mean, std, s_t, logp_of = F.sde_step(x, self._velocity(x, sigma, cond, cfg_scale), sigma, sigma_n, s.kind,
                                             s.noise_level)
        logp = logp_of(xn)
        if start is not None and first:  # the step's first round holds the starting weights
            logp_start = logp.detach()
        logp_old = logp_start if start is not None else logp_gen
        low = t.clip_range if t.clip_range_low is None else t.clip_range_low
        high = t.clip_range if t.clip_range_high is None else t.clip_range_high
        if t.algorithm == "grpo_guard":
            sig = std.reshape(len(rows))
            bias = F.guard_bias(mean, batch.means[rows, j], sig, self._forwards(rows) if t.guard_bias == "batch" else None)
            dt = (sigma_n - sigma).to(logp.dtype)
            term = lambda adv: F.clipped(sig * (logp - logp_old + bias), adv, low, high) / (-dt)  # noqa: E731
        else:
            term = lambda adv: F.clipped(logp - logp_old, adv, low, high)  # noqa: E731
        ws = [float(o.get("weight", 1.0)) for o in self.cfg.reward.values()]
        if a.ndim == 1:
            loss = term(a)
        elif F.reward_aggregation(t) == "advantages":  # MixGRPO: one loss of clamp(sum_k w_k A_k, +-c)
            loss = term(F.aggregated_advantage(a, ws, t.adv_clip_max))
        else:  # DanceGRPO's multi-reward loss: sum_k w_k L(A_k)
            loss = sum(w * term(a[:, i]) for i, w in enumerate(ws))
        if t.tis_cap is not None:
            loss = loss * torch.exp(logp_start - logp_gen).clamp(max=t.tis_cap).detach()
        klv = torch.zeros_like(logp)
        if t.beta_kl > 0:
            with torch.no_grad():
                ref_mean = F.sde_step(x, self._velocity(x, sigma, cond, cfg_scale, self.ref), sigma, sigma_n, s.kind,
                                      s.noise_level)[0]
            klv = F.kl(mean, ref_mean, s_t if t.kl_form == "flow_grpo" else std)
        return loss, klv, 0.5 * (logp - logp_old).detach() ** 2

    def _forwards(self, rows) -> list[tuple[int, int]]:
        """Which of ``rows`` (b = group x G + generation) the product forwards together at one trained position:
        the chunk shape's blocks of ``train.chunk_generations`` consecutive generations of one group (a packed
        colocated worker's tiles and the TSP modes': docs/architecture.md, "Sharded trainer pool" / TSP), of
        which a round trains its rows. GRPO-Guard's ``guard_bias=batch`` averages its bias over each block
        (flow_grpo: over the device's batch of a timestep)."""
        G = self.cfg.train.generations
        width = min(self.cfg.train.chunk_generations, G)
        return [(i // G, (i % G) // width) for i in rows]

    def _nft_cells(self, batch, rows, j, a, cond):
        """(DiffusionNFT's loss, its velocity KL, mean((v - v_old)^2)) of the rows' training slot j."""
        t = self.cfg.train
        x0 = batch.final[rows]
        draws = [F.nft_slot(int(batch.seed[i]), j, len(batch.sigmas) - 1, x0.shape[1:]) for i in rows]
        sig = batch.sigmas[torch.tensor([d[0] for d in draws])]
        eps = torch.stack([d[1] for d in draws])
        tt = sig.reshape(-1, *([1] * (x0.ndim - 1)))
        x_t = (1 - tt) * x0 + tt * eps
        v_old = None
        if self.old is not None:
            with torch.no_grad(), self.holding(self.old):
                v_old = self._velocity(x_t, sig, cond, 1.0)
        v = self._velocity(x_t, sig, cond, 1.0)
        v_old = v.detach() if v_old is None else v_old
        loss = F.nft_loss(v, v_old, x_t, x0, sig, a, t.adv_clip_max, t.nft_beta)
        klv = torch.zeros_like(loss)
        if t.beta_kl > 0:
            with torch.no_grad():
                v_ref = self._velocity(x_t, sig, cond, 1.0, self.ref)
            klv = ((v - v_ref) ** 2).mean(dim=tuple(range(1, v.ndim)))
        return loss, klv, ((v - v_old) ** 2).detach().mean(dim=tuple(range(1, v.ndim)))


def reference_run(cfg, *, policy=None, reward=None, task=None, eval_weights: bool = False):
    """(the policy's state after ``cfg.steps`` steps, the steps' metric rows, the ``Reference``)."""
    ref = Reference(cfg, policy=policy, reward=reward, task=task)
    rows = [ref.step(k) for k in range(cfg.steps)]
    return ref.state(eval_weights), rows, ref
