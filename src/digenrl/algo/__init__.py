"""Pure math of Flow-GRPO / DanceGRPO: SDE steps with log-probs, sigma schedules, advantages, losses."""

from digenrl.algo.advantage import AdvantageStats, group_advantages
from digenrl.algo.loss import PolicyLossStats, clipped_policy_loss, gaussian_kl
from digenrl.algo.sde import SDEStepOutput, sde_step_with_logprob
from digenrl.algo.sigmas import flow_match_sigmas, resolution_shift_mu
from digenrl.algo.timesteps import TimestepPlan, select_timesteps

__all__ = [
    "AdvantageStats",
    "group_advantages",
    "PolicyLossStats",
    "clipped_policy_loss",
    "gaussian_kl",
    "SDEStepOutput",
    "sde_step_with_logprob",
    "flow_match_sigmas",
    "resolution_shift_mu",
    "TimestepPlan",
    "select_timesteps",
]
