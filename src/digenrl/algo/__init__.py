"""Pure math of Flow-GRPO / DanceGRPO, one module per concept (import them directly):

* ``sde``: SDE steps with log-probs (``sde_step_with_logprob``); ``sigmas``: sigma schedules;
* ``advantage``: group-relative advantages; ``loss``: the clipped policy loss and the KL to the reference;
* ``timesteps``: which denoising steps are SDE steps and which are trained (no torch: the planning path
  of the simulator uses it).

The package itself imports nothing, so that importing ``digenrl.algo.timesteps`` stays free of torch.
"""
