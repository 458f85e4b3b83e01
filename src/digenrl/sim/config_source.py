"""A run config as a source of ``sim.planner``: the candidates of ``digenrl plan --config`` and of
``digenrl simulate --config``, each priced as the config ``digenrl train`` would run.

A candidate (``planner.Candidate``) becomes a config (``config_of``): the split as ``runtime.generators / trainers``
(colocated: 1 / W), the fragment size, the stale cap, the publish path, the stale hold, ``train.shard_groups``,
``tuning.tag_inference_copy``, ``tuning.gang_groups`` and the two sequence-parallel degrees; on a ``--testbed``
``train.memory_gb`` = the trainer GPU's memory. That config must pass the memory plan of ``digenrl train``
(``train.memory_check.check_config`` / ``check_generators``) and ``control.run_plan.plan_run``; a refusal is the
candidate's ``Infeasible`` reason. Its plan is ``plan_run``'s (a colocated FSDP config: one worker per rank, priced
as the peers' idealised colocated FSDP bound, ``sim.colocation``), with the planner's one chunk-shape rule
(``sim.scenario.rule_chunk``) at most the chunk the memory plan holds; a colocated candidate with a memory plan
(searched, or the colocated baseline of another config) trains in the chunk ``train.chunk_cells: auto`` gives (the
most cells a rank holds), not the config's shape. The config written carries that chunk shape.

Costs: on a testbed, the roofline of the candidate config's model and workload (``sim.from_config``) on the split's
GPUs; with a profile, the profile at the candidate's trainer count (``control.profile.profile_at``; a profile that
does not name its ``trainers`` is taken as measured on the config's own pools).

Values: those of ``sim.scenario.PresetSource`` on the same workload (roofline: shard groups, TAG copy, gang width,
publish path; a profile prices the config's own), and in ``full`` the stale caps ``planner.STALE_CAPS``.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import ConfigError
from ..schedule import Mode
from .from_config import ConfigSimError, config_model, config_workload, pools_for
from .planner import STALE_CAPS, Candidate, Infeasible, Split, divisors
from .scenario import (PresetSource, Scenario, colocated_options, limits, make_cost, profile_cost, rule_chunk,
                       split_options)


class ConfigSource:
    """``sim.planner.Source`` of a config on ``workers`` GPUs, with ``testbed`` (roofline) or ``profile``
    (measured, at ``profile_trainers`` trainer ranks). ``pinned``: only the config's own candidate (its pools).
    ``baseline``: the colocated baseline of another config (``colocated_source``), which trains in its own chunk."""

    def __init__(self, cfg, workers: int, *, testbed=None, profile=None, profile_trainers: int | None = None,
                 pinned: bool = False, baseline: bool = False):
        from ..control.run_plan import plan_run

        if (testbed is None) == (profile is None):
            raise ValueError("ConfigSource: give exactly one of testbed or profile")
        self.cfg, self.workers, self.mode = cfg, workers, Mode(cfg.runtime.mode)
        self.bts, self.testbed, self.profile, self.pinned = cfg.bts_config(), testbed, profile, pinned
        self.profile_trainers = profile_trainers or (cfg.runtime.trainers if profile is not None else None)
        run = plan_run(cfg)  # refuses what the runtime refuses, before any search
        self.trained, self.fragment = run.trained_timesteps, run.plan.fragment_size  # the runtime's own values
        self.preset, self._configs, self._starts, self.baseline = None, {}, {}, baseline
        if testbed is not None:
            if workers > testbed.total:
                raise ConfigSimError(f"--gpus: {workers} exceeds testbed {testbed.name} ({testbed.total} GPUs)")
            if workers < 2:
                raise ConfigSimError(f"--gpus: the roofline needs at least 2 GPUs (got {workers})")
            setup = Scenario(config_model(cfg), testbed, config_workload(cfg, self.trained), workers, cfg.steps,
                             cfg.runtime.max_stale_fraction)
            self.preset = PresetSource(setup, self.mode, self.bts)

    # ---- the Source protocol ---------------------------------------------------------------------------------

    def splits(self) -> list[Split]:
        if self.pinned:
            return [self.own_split()]
        if self.preset is not None:
            return self.preset.splits()
        if self.mode is Mode.COLOCATED:
            return [Split(0, self.workers)]
        return [Split(g, self.workers - g) for g in range(1, self.workers)]

    def own_split(self) -> Split:
        tb, (n_gen, n_train) = self.testbed, pools_for(self.cfg, None)
        if tb is None:
            return Split(n_gen, n_train)
        opts = colocated_options(self.preset.setup) if n_gen == 0 else split_options(self.preset.setup)
        return next((s for s in opts if (s.n_gen, s.n_train) == (n_gen, n_train)),
                    Split(n_gen, n_train, tb.gpu, tb.gpu2 or tb.gpu))

    def start(self, split: Split) -> Candidate:
        """The config's own values on ``split``; searched (not pinned), where they do not fit, the smallest
        sequence-parallel degrees (trainer first) that do."""
        own = self._own(split)
        if self.pinned or self.preset is None:
            return own
        if split not in self._starts:
            self._starts[split] = own
            tries = [own] + [replace(own, sequence_parallel=d, generator_sequence_parallel=g)
                             for d in self.values(split, "sequence_parallel")
                             for g in self.values(split, "generator_sequence_parallel")]
            for c in tries:
                try:
                    self.build(c)
                except Infeasible:
                    continue
                self._starts[split] = c
                break
        return self._starts[split]

    def _own(self, split: Split) -> Candidate:
        rt, t, tu = self.cfg.runtime, self.cfg.train, self.cfg.tuning
        return Candidate(split, self.fragment, rt.max_stale_fraction,
                         t.shard_groups if t.sharding == "fsdp" else 1, tu.tag_inference_copy, rt.publish,
                         tu.gang_groups, t.sequence_parallel.degree, rt.generator_sequence_parallel.degree,
                         tu.stale_hold)

    def values(self, split: Split, axis: str) -> list:
        own = getattr(self._own(split), axis)
        if self.pinned:
            return [own]
        if axis == "fragment_size":
            return divisors(self.cfg.train.generations)
        if axis == "max_stale_fraction":
            return list(STALE_CAPS) if self.mode is Mode.FULL else [own]
        if self.preset is None:
            return [own]
        vals = self.preset.values(split, axis)
        return vals if len(vals) > 1 else [own]

    def build(self, c: Candidate):
        """(cost model, plan) of candidate ``c`` (module docstring); raises ``Infeasible``."""
        cc = self.config_of(c)
        run, cap = self._plan(cc)  # the memory plan of ``digenrl train`` refuses first, naming its keys
        cost = self._cost(c, cc)
        w = config_workload(cc, run.trained_timesteps) if self.preset is not None else None
        max_cells = limits(cost, w)[1] if w is not None else cap
        plan = run.plan
        if plan.mode.tsp and not self.pinned:
            cg, cs = rule_chunk(plan, cost, max_cells if max_cells else plan.generations * plan.trained_timesteps)
            cc = cc.model_copy(update={"train": cc.train.model_copy(
                update={"chunk_generations": cg, "chunk_timesteps": cs, "chunk_cells": None})})
            plan = self._plan(cc)[0].plan
        elif c.split.n_gen == 0 and (self.baseline or not self.pinned) and cap is not None:
            cc = self._colocated_chunk(cc, run.trained_timesteps)
            plan = self._plan(cc)[0].plan
        if w is not None:
            plan = replace(plan, sampling_steps=cost.workload.denoise_steps if hasattr(cost, "workload")
                           else plan.sampling_steps)  # MixGRPO-Flash samples fewer steps
        self._configs[c] = cc
        return cost, plan

    @staticmethod
    def _colocated_chunk(cc, trained: int):
        """A colocated candidate's chunk shape: the one ``train.chunk_cells: auto`` gives (the most cells a rank
        holds, ``train.memory_check.resolve_chunk_cells``), as a colocated peer sizes its micro-batch, not the
        config's shape (a planned preset's is its disaggregated plan's); ``scripts/plan_presets.py`` starts alike."""
        from ..train.memory_check import resolve_chunk_cells

        auto = cc.model_copy(update={"train": cc.train.model_copy(update={"chunk_cells": "auto"})})
        t = resolve_chunk_cells(auto, trained).train
        return cc.model_copy(update={"train": t.model_copy(update={"chunk_cells": None})})

    # ---- candidate -> config ---------------------------------------------------------------------------------

    def config_for(self, c: Candidate):
        """The config ``digenrl plan`` writes for ``c``, as ``build`` made it (with its chunk shape)."""
        return self._configs[c]

    def config_of(self, c: Candidate):
        """``cfg`` with the candidate's settings (module docstring); on a testbed, its trainer GPU's memory."""
        cfg, t = self.cfg, self.cfg.train
        rt = {"fragment_size": c.fragment_size, "max_stale_fraction": c.max_stale_fraction, "publish": c.publish,
              "generator_sequence_parallel": {"ulysses": c.generator_sequence_parallel},
              **({"generators": 1, "trainers": c.split.n_train} if c.split.n_gen == 0 else
                 {"generators": c.generators, "trainers": c.split.n_train})}
        tr = {"sequence_parallel": {"ulysses": c.sequence_parallel}}
        if t.sharding == "fsdp":
            tr["shard_groups"] = c.shard_groups
        if self.testbed is not None:
            tr["memory_gb"] = (c.split.train_gpu or self.testbed.gpu).memory_gb
        data = cfg.model_dump(mode="json")
        data["runtime"].update(rt)
        data["train"].update(tr)
        data["tuning"].update({"stale_hold": c.stale_hold, "tag_inference_copy": c.tag_copy,
                               "gang_groups": c.gang_groups})
        if c.split.n_gen == 0:
            data["runtime"]["generator_sequence_parallel"] = {"ulysses": 1}
        from ..config import Config

        try:
            return Config.model_validate(data)
        except (ValueError, ConfigError) as e:
            errs = getattr(e, "errors", None)
            raise Infeasible(errs()[0]["msg"] if callable(errs) else str(e)) from None

    def _plan(self, cc):
        """(plan_run, the chunk cells the memory plan holds or None) of a candidate config; raises Infeasible."""
        from ..control.run_plan import plan_run
        from ..train.memory import GiB, MemoryPlanError
        from ..train.memory_check import check_config, check_generators, lanes
        try:
            gen_gb = None
            if self.testbed is not None and cc.runtime.mode != "colocated":
                gen_gb = self.testbed.gpu.memory_gb
            mp = check_config(cc.model_copy(update={"train": cc.train.model_copy(update={"chunk_cells": "auto"})}))
            check_generators(cc, gen_gb)
            if self.pinned and cc.train.chunk_cells == "auto":  # the config's own chunk, as the runtime resolves it
                from ..control.run_plan import timestep_plan
                from ..train.memory_check import resolve_chunk_cells
                cc = resolve_chunk_cells(cc, len(timestep_plan(cc, 0).trained))
            run = plan_run(_unsharded_colocated(cc))
        except (MemoryPlanError, ConfigError) as e:
            raise Infeasible(str(e)) from None
        cap = None
        if mp is not None:
            cap = mp.max_cells(cc.train.memory_gb * GiB) * lanes(cc)
        return run, cap

    def _cost(self, c: Candidate, cc):
        if self.profile is not None:
            return profile_cost(self.profile, self.profile_trainers, c.split.n_train)
        setup = replace(self.preset.setup, workload=config_workload(cc, self.trained))
        return make_cost(setup, c, c.split.n_gen == 0)


def run_config_modes(config: str | None, sets: list[str], modes: list[str], *, testbed=None, profile=None,
                     profile_trainers: int | None = None, gpus: int | None = None, search_plan: bool = False,
                     probe_steps: int = 4, jitter: float = 0.0, seed: int = 0, record_mode: str | None = None) -> dict:
    """``digenrl simulate --config``: every requested mode plus the baselines ``naive`` and ``colocated``, each
    the config's own plan on its pools (or ``gpus`` in its ratio, ``from_config.pools_for``; a colocated config's
    W workers split W // 2 + the rest for the disaggregated modes), or with ``search_plan`` the planner's choice on
    those GPUs (what ``digenrl plan`` writes for that mode), simulated for ``steps``; ``{mode: scenario.ModeRun}``.
    Raises ConfigError / ConfigSimError (exit 2 in the CLI). With a profile, a baseline whose trainer count it
    cannot price (``profile_at``), or any mode where the profile does not name its ``trainers``, is priced as
    profiled, and its row says so."""
    from ..config import load_config
    from .executor import simulate
    from .planner import search
    from .scenario import ModeRun

    base = load_config(config, sets)
    if testbed is not None:
        config_model(base)  # refuses an unknown family before anything else
    n_gen, n_train = pools_for(base, gpus if profile is None else None)  # a profile prices the config's own pools
    if testbed is not None and n_gen + n_train > testbed.total:
        raise ConfigSimError(f"--gpus: {n_gen + n_train} GPUs ({n_gen} generators + {n_train} trainers) exceed "
                             f"testbed {testbed.name} ({testbed.total} GPUs)")
    if n_gen == 0 and profile is not None:
        n_gen, n_train = base.runtime.generators, base.runtime.trainers  # (the modes' pools; colocated on all)
    elif n_gen == 0:
        if n_train < 2:
            raise ConfigSimError(f"runtime.trainers: {n_train} colocated worker cannot be split into two pools")
        n_gen, n_train = n_train // 2, n_train - n_train // 2
    measured = profile_trainers or base.runtime.trainers
    gsp, workers = base.runtime.generator_sequence_parallel.degree, n_gen + n_train
    kw = {"testbed": testbed, "profile": profile, "profile_trainers": measured, "pinned": not search_plan}
    opt, where = ("--testbed", f"testbed {testbed.name}") if testbed is not None else ("--profile", "the profile")
    runs = {}
    for m in dict.fromkeys(list(modes) + ["naive", "colocated"]):
        if m != "colocated":
            pools = [f"runtime.mode={m}", f"runtime.generators={max(1, n_gen // gsp)}", f"runtime.trainers={n_train}"]
            src = ConfigSource(load_config(config, sets + pools), workers, **kw)
        else:
            try:
                src = colocated_source(base, workers, **kw)
            except ValueError as e:  # (e.g. its sequence-parallel degree does not divide the workers)
                raise ConfigSimError(f"{opt}: colocated does not fit {where}: {e}") from None
        cfg, note, res = src.cfg, "", None
        try:
            res = search(src, probe_steps=probe_steps) if search_plan else None
            c = res.best.candidate if res is not None else src.start(src.own_split())
            cost, plan = src.build(c)
        except (Infeasible, ValueError) as e:
            refused = ConfigSimError(f"{opt}: {m} does not fit {where}: {e}")
            if profile is None or (m in modes and profile_trainers is not None):
                raise refused from None
            src.profile_trainers = cfg.runtime.trainers  # a baseline: as profiled
            try:
                c = src.start(src.own_split())
                cost, plan = src.build(c)
            except ValueError:  # not a pricing matter (the memory plan, a group size)
                raise refused from None
            note = (f"all-reduce at {cfg.runtime.trainers} ranks priced as profiled at {measured}" if profile_trainers
                    else f"profile without pool sizes: all-reduce at {cfg.runtime.trainers} ranks as profiled")
        if m == "colocated" and cfg.train.sharding == "fsdp":
            note = note or "colocated FSDP priced as the idealised bound (inference copy)"
        plan = replace(plan, steps=cfg.steps)
        runs[m] = ModeRun(Mode(m), c, plan, simulate(plan, cost, jitter=jitter, seed=seed, bts=src.bts,
                                                     record=(m == record_mode)), note, res)
    return runs


def colocated_on(cfg, workers: int):
    """The colocated baseline of ``cfg`` on the same ``workers`` GPUs: ``runtime.mode=colocated``,
    ``runtime.generators=1``, ``runtime.trainers=workers``; colocated has no generator pool, so no generator
    sequence parallelism and the ``generator`` section's defaults; FSDP: one shard group over all workers (the
    peers' colocated FSDP, priced as its idealised bound: ``_unsharded_colocated``). A colocated config on its own
    workers is its own baseline. Validated where it is priced (``ConfigSource``)."""
    rt = cfg.runtime
    if rt.mode == "colocated" and rt.trainers == workers:
        return cfg
    return cfg.model_copy(update={
        "runtime": rt.model_copy(update={"mode": "colocated", "generators": 1, "trainers": workers,
                                         "generator_sequence_parallel": type(rt.generator_sequence_parallel)()}),
        "train": cfg.train.model_copy(update={"shard_groups": 1}), "generator": type(cfg.generator)()})


def colocated_source(cfg, workers: int, **kw) -> ConfigSource:
    """``ConfigSource`` (``kw``) of ``colocated_on(cfg, workers)``: what ``digenrl plan`` searches, ``digenrl simulate
    --config`` runs as its ``colocated`` row and ``digenrl train`` predicts (``sim.prediction``). The baseline of
    another config trains in its own chunk (``ConfigSource._colocated_chunk``), pinned or not."""
    co = colocated_on(cfg, workers)
    return ConfigSource(co, workers, baseline=co is not cfg, **kw)


def _unsharded_colocated(cc):
    """A colocated FSDP config is planned with one worker per rank, or per sequence-parallel lane of its degree (the
    peers' idealised colocated FSDP bound, ``sim.colocation``, as ``scenario.make_plan`` plans it: the cost model
    prices a lane's ops at its degree, so the plan must hold lanes, not ranks); every other config as is."""
    if cc.runtime.mode != "colocated" or cc.train.sharding != "fsdp":
        return cc
    return cc.model_copy(update={"train": cc.train.model_copy(update={"sharding": "none", "shard_groups": 1})})


__all__ = ["ConfigSource", "colocated_on", "colocated_source", "run_config_modes"]
