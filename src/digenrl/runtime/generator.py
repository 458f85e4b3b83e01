"""``GeneratorWorker``: one rollout replica of the generator pool (a Ray actor, one call at a time; its calls:
``workers.GeneratorAPI``).

A ``generate`` of a version the worker does not hold yet first swaps it in, from the published state's ref
(object store) or from what a broadcast / stream staged in its ``WeightInbox``; weights therefore change only
between fragments, and every trajectory records the one version that produced it (with its behaviour
log-probs: TCSS needs both). The policy is its inference copy (``models.fast_generator``, the ``generator``
section): LoRA merged once per version, an inference dtype, a compiled transformer; the publish paths receive
the trainers' tensors as sent (``FastGenerator.layout``) and ``load`` casts and merges them.

Sequence-parallel generator (``runtime.generator_sequence_parallel`` = d): the scheduler's ``gen<i>`` is d actors
``gen<i>.<j>`` in one torch.distributed group; every call goes to all of them, they run every forward together,
each on 1 / d of every sequence (``models.sequence_parallel``), and only the first (the lead) decodes, scores
and returns the fragment.

The actor deliberately has no concurrency groups: a threaded Ray actor keeps its main thread busy while a
task runs (a whole CPU core per generator; measured with Ray 2.60), which would halve a CPU pipeline."""

from __future__ import annotations

import time

from .messages import TimedResult
from .publish import WeightInbox, init_groups, stream_receive
from .worker_base import WorkerBase, fetch
from .workers import GeneratorAPI


class GeneratorWorker(WorkerBase, GeneratorAPI):
    pool = "generator"

    def __init__(self, name: str, config: dict, hooks=None, log_file: str | None = None):
        super().__init__(name, config, hooks, log_file)
        import torch

        from digenrl.models.registry import build_policy
        from digenrl.rewards.registry import build_weighted
        from digenrl.tasks.base import build_task
        from digenrl.train.context import sampler_settings

        torch.manual_seed(self.cfg.seed)
        self.policy = build_policy(self.cfg.model)  # keeps its trainable flags: they name what a publish moves
        from digenrl.models.fast_generator import FastGenerator

        self.fast = FastGenerator(self.policy, self.cfg.generator)  # LoRA merged / dtype / compiled (generator.*)
        self.reward = build_weighted(self.cfg.reward)
        self.task = build_task(self.cfg.task)
        self.sampler = sampler_settings(self.cfg)
        self.version = -1  # nothing loaded yet: version 0 is published before the run starts
        self.inbox = WeightInbox()
        self._senders: tuple = ()  # (world rank, group) of each sender of a broadcast or stream publish
        self._lead = True  # a sequence-parallel generator's first rank (``setup_dist``)
        self.check_failure("startup")

    def setup_dist(self, spec) -> bool:
        groups = init_groups(spec, self.cfg.runtime.collective_timeout_s)
        self._senders = groups.streams
        if groups.sequence is not None:
            from digenrl.models.sequence_parallel import enable_sequence_parallel

            sg = enable_sequence_parallel(self.policy, groups.sequence, "runtime.generator_sequence_parallel")
            self._lead = sg.rank == 0
        return True

    def _swap_in(self, version: int, weights: list | None) -> None:
        if version == self.version:
            return
        if version < self.version:
            raise RuntimeError(f"{self.name}: version {version} is older than the held version {self.version}")
        if weights:
            state = fetch(weights[:1])[0]
        else:
            state = self.inbox.take(version)
        if state is None:
            raise RuntimeError(f"{self.name}: version {version} was never published to it (holds {self.version}, "
                               f"staged {self.inbox.versions()})")
        self.fast.load(state)  # (generator.merge_lora: W0 + s B A of this version, merged once)
        self.version = version

    def load_weights(self, version: int, weights: list) -> TimedResult:
        """Swap ``version`` in now from ``weights`` = [its published state's ref] (version 0 before the run)."""
        t0 = time.monotonic()
        self._swap_in(version, weights)
        return TimedResult(self.name, "receive", t0, time.monotonic(), version)

    def generate(self, fragment, version: int, weights: list | None = None):
        self.check_failure(fragment.step)
        self._swap_in(version, weights)
        held = self.version
        batch, infos = self.generate_parts(self.policy, (fragment,), held, self._lead)
        info = infos[0]
        if self.version != held:  # cannot happen: only this actor's own calls swap weights
            raise RuntimeError(f"{self.name}: weights changed while generating {fragment}")
        offset = self.hooks.logprob_offset
        if offset and batch is not None:  # test hook: a generator whose recorded log-probs are biased (verl-omni PR 279's +5e-3)
            batch.log_probs = batch.log_probs + offset
        return batch, info

    def receive_broadcast(self, version: int) -> TimedResult:
        """Stage ``version`` from the publish's senders (rank 0's broadcast, or every sender's stream)."""
        t0 = time.monotonic()
        self.inbox.put(version, stream_receive(self.policy, self._senders, self.fast.layout))
        return TimedResult(self.name, "receive", t0, time.monotonic(), version)

    receive_stream = receive_broadcast
