"""What each training algorithm (``train.algorithm``) asks of the hardware: the roofline's per-algorithm work.

Per sample, with T sampling steps, trained cells S, the model's transformer forwards per denoising step
``fps`` (2 with true CFG, 1 guidance-distilled) and a latent of ``L`` bf16 values:

==============  ====================  ===========================  ===============  ===========================
algorithm       denoising steps       trained cells S              forwards / cell  moved to the trainers
==============  ====================  ===========================  ===============  ===========================
flow_grpo       T                     int(T x fraction)            fps (CFG)        2S latents + S log-probs
grpo_guard      T                     int(T x fraction)            fps              3S latents (+ S means)
mixgrpo         T                     window w                     fps              2S latents + S log-probs
mixgrpo, Flash  L + n_post (mean)     window w                     fps              2S latents + S log-probs
nft             T (ODE)               K (default int(0.99 T))      1 (CFG-free)     1 latent (x_0)
==============  ====================  ===========================  ===============  ===========================

(plus the prompt embedding, in every case). MixGRPO-Flash (``sampler.post_solver=dpmpp_2m`` with
``sampler.post_compress_ratio`` r < 1): after the window's last SDE step L the ODE runs on a rebuilt schedule of
``n_post = max(int(max((T - L) r, 1)), 2)`` values (``algo.dpm.post_window_sigmas``: sigma_0..sigma_L, then
those), so a sample takes L + n_post denoising steps; the window's start moves over one cycle of positions 0 .. T - 2, clamped to T - 2 - w, during training
(``algo.timesteps``, ``mixgrpo``, stride 1 as in MixGRPO's FLUX recipe), and the cost model takes the mean over
that cycle. DiffusionNFT trains each sample at K freshly noised timesteps of its clean
result with one CFG-free forward per cell, and needs neither the trajectory's latents nor its log-probs. Its
old policy (``train.nft_old_policy``, ``train.nft_old``): ``current`` takes v_old from that same forward;
``soft`` (the default, DiffusionNFT's) keeps a copy of the trainable parameters and adds, per trained cell, a
no-grad forward with the copy swapped in (its FLOPs, and under FSDP its all-gather), per chunk the two in-place
exchanges of the copy (3 tensor copies each: 2 x 3 x (read + write) x 4 bytes = 48 bytes per trainable parameter
of the rank, at HBM bandwidth), and per commit the soft update ``old <- d old + (1 - d) theta`` (read and write
old, read theta, write old again: 5 x 4 = 20 bytes per parameter; priced on every commit, exact with one
optimizer step per step). The copy's memory (4 bytes per trainable parameter, the step-start snapshot's too) is
in the memory plan (``train.memory``: ``copies``); the publishes and TAG generations that swap it in are not priced
(two exchanges each).

Recomputed old log-probs (``train.old_logprob=recompute``, ``train.old_logprob``; ``recompute_share`` = q): a
cell of the step's first round gets logp_old from its own training forward (free); a cell of a later round gets
one no-grad forward with the step-start snapshot swapped in. With R = minibatches x inner epochs rounds of equal
size, q = (R - 1) / R of the cells pay that forward (its FLOPs, and under FSDP its all-gather) and the snapshot's
two in-place exchanges (48 bytes per trainable parameter of the rank, per chunk), and every step copies the live
weights into the snapshot once (read + write, 8 bytes per parameter, priced as 8 / R on every commit). q = 0 (one
round per step, or the default ``generator`` log-probs) prices nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algo.timesteps import nft_train_count

ALGORITHMS = ("flow_grpo", "grpo_guard", "mixgrpo", "nft")


class AlgorithmError(ValueError):
    """A bad algorithm setting of the simulator; the message names the option."""


@dataclass(frozen=True)
class Algorithm:
    """The training algorithm of a simulated workload and its shape parameters.

    ``window``: MixGRPO's SDE window w (its FLUX recipe: 4). ``flash_ratio``: MixGRPO-Flash's
    ``post_compress_ratio`` (1.0: no Flash). ``nft_timesteps``: DiffusionNFT's K (None: int(0.99 T)).
    ``nft_old``: DiffusionNFT's old policy, ``soft`` (its default) or ``current`` (module docstring).
    """

    name: str = "flow_grpo"
    window: int = 4
    flash_ratio: float = 1.0
    nft_timesteps: int | None = None
    nft_old: str = "soft"
    recompute_share: float = 0.0  # train.old_logprob=recompute: the share q of cells with an extra no-grad forward
    recompute_rounds: int = 1     # R, the rounds (optimizer steps) per step over which the snapshot copy spreads

    def __post_init__(self) -> None:
        if self.name not in ALGORITHMS:
            raise AlgorithmError(f"--algorithm: {self.name!r} is not one of {', '.join(ALGORITHMS)}")
        if self.window < 1:
            raise AlgorithmError(f"--window: must be >= 1 (got {self.window})")
        if not 0.0 < self.flash_ratio <= 1.0:
            raise AlgorithmError(f"--flash-ratio: must lie in (0, 1] (got {self.flash_ratio})")
        if self.flash_ratio < 1.0 and self.name != "mixgrpo":
            raise AlgorithmError("--flash-ratio: MixGRPO-Flash's compressed ODE needs --algorithm mixgrpo")
        if self.nft_timesteps is not None and (self.nft_timesteps < 1 or self.name != "nft"):
            raise AlgorithmError(f"--nft-timesteps: needs --algorithm nft and a value >= 1 (got {self.nft_timesteps})")
        if self.nft_old not in ("soft", "current"):
            raise AlgorithmError(f"--nft-old-policy: {self.nft_old!r} is not one of soft, current")
        if not 0.0 <= self.recompute_share < 1.0 or self.recompute_rounds < 1:
            raise AlgorithmError(f"recompute_share: must lie in [0, 1) with recompute_rounds >= 1 (got "
                                 f"{self.recompute_share}, {self.recompute_rounds})")

    def trained(self, T: int, fraction: float) -> int:
        """S, the trained cells per sample."""
        if self.name == "mixgrpo":
            if self.window > T - 2:
                raise AlgorithmError(f"--window: {self.window} does not fit MixGRPO's range [0, T - 2) of T = {T}")
            return self.window
        if self.name == "nft":  # the runtime's rule (default int(0.99 T), at least 1; K <= T)
            try:
                return nft_train_count(T, self.nft_timesteps)
            except ValueError as e:
                raise AlgorithmError(f"--nft-timesteps: {e}") from None
        return max(1, int(T * fraction + 1e-9))

    def denoise_steps(self, T: int) -> float:
        """Mean denoising steps per sample over a cycle of the window's positions (MixGRPO-Flash)."""
        if self.name != "mixgrpo" or self.flash_ratio >= 1.0:
            return float(T)
        w, M = self.trained(T, 1.0), T - 2
        steps = []
        for p in range(M + 1):  # one cycle of MixGRPO's progressive schedule (stride 1), the start clamped
            last = min(p, M - w) + w - 1
            n_post = max(int(max((T - last) * self.flash_ratio, 1)), 2)
            steps.append(last + n_post)
        return sum(steps) / len(steps)

    def train_forwards(self, model_fps: int) -> int:
        """Transformer forwards of one trained cell: DiffusionNFT trains CFG-free."""
        return 1 if self.name == "nft" else model_fps

    @property
    def soft_old(self) -> bool:
        return self.name == "nft" and self.nft_old == "soft"

    def old_forwards(self) -> float:
        """No-grad forwards per trained cell besides the training one: the soft old policy's v_old, the
        recomputed logp_old of a later round's cells (on average q)."""
        return (1.0 if self.soft_old else 0.0) + self.recompute_share

    def chunk_copy_bytes(self) -> float:
        """Bytes moved per trainable parameter of a rank per training chunk: the old copy's two exchanges (the
        step-start snapshot's, in a share q of the chunks)."""
        return (48.0 if self.soft_old else 0.0) + 48.0 * self.recompute_share

    def commit_copy_bytes(self) -> float:
        """Bytes moved per trainable parameter of a rank per commit: the old copy's soft update; the step-start
        snapshot's copy, once per step (8 / R per commit)."""
        snap = 8.0 / self.recompute_rounds if self.recompute_share > 0 else 0.0
        return (20.0 if self.soft_old else 0.0) + snap

    def moved_latents(self, S: int) -> tuple[int, int]:
        """(latents, per-cell scalars) of one trajectory that go to the trainers."""
        if self.name == "nft":
            return 1, 0
        if self.name == "grpo_guard":
            return 3 * S, S
        return 2 * S, S
