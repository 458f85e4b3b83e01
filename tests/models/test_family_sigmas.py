"""Family sigma schedules against diffusers' FlowMatchEulerDiscreteScheduler.set_timesteps."""

import numpy as np
import pytest
import torch

from digenrl.algo.sigmas import resolution_shift_mu
from digenrl.models.diffusers_files import family_sigmas


def diffusers_sigmas(config: dict, n: int, grid: str, seq_len: int | None) -> torch.Tensor:
    from diffusers import FlowMatchEulerDiscreteScheduler

    s = FlowMatchEulerDiscreteScheduler(**config)
    mu = None
    if config.get("use_dynamic_shifting"):
        mu = resolution_shift_mu(seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                                 config.get("base_shift", 0.5), config.get("max_shift", 1.15))  # fmt: skip
    sig = np.linspace(1.0, 1 / n, n) if grid == "linear" else None
    s.set_timesteps(n if sig is None else None, sigmas=sig, mu=mu)
    return s.sigmas.float()


@pytest.mark.parametrize(
    "config, grid, seq_len",
    [
        ({"shift": 3.0}, "scheduler", None),  # SD3.5
        ({"shift": 1.0, "use_dynamic_shifting": True, "max_shift": 1.15}, "linear", 1024),  # FLUX.1 at 512 px
        ({"shift": 1.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 0.9,
          "max_image_seq_len": 8192, "shift_terminal": 0.02}, "linear", 1024),  # Qwen-Image
        ({"shift": 7.0}, "linear", None),  # HunyuanVideo
    ],
)  # fmt: skip
@pytest.mark.parametrize("n", [1, 6, 28])
def test_matches_diffusers_scheduler(config, grid, seq_len, n):
    ours = family_sigmas({"_class_name": "FlowMatchEulerDiscreteScheduler", **config}, n, grid=grid, image_seq_len=seq_len)
    if n == 1 and "shift_terminal" in config:  # diffusers divides 0 / 0 here; we keep the plain 1 -> 0 step
        torch.testing.assert_close(ours, torch.tensor([1.0, 0.0]))
        return
    torch.testing.assert_close(ours, diffusers_sigmas(config, n, grid, seq_len), atol=1e-6, rtol=0)


def test_unipc_flow_shift_maps_to_euler_shift_and_bad_configs_are_refused():
    unipc = {"_class_name": "UniPCMultistepScheduler", "use_flow_sigmas": True, "flow_shift": 5.0}
    torch.testing.assert_close(family_sigmas(unipc, 20, grid="scheduler"), diffusers_sigmas({"shift": 5.0}, 20, "scheduler", None))
    with pytest.raises(ValueError, match="use_flow_sigmas"):
        family_sigmas({"_class_name": "UniPCMultistepScheduler"}, 4, grid="scheduler")
    with pytest.raises(ValueError, match="use_karras_sigmas"):
        family_sigmas({"use_karras_sigmas": True}, 4, grid="scheduler")
    with pytest.raises(ValueError, match="DDIMScheduler"):
        family_sigmas({"_class_name": "DDIMScheduler"}, 4, grid="scheduler")
    with pytest.raises(ValueError, match="image token count"):
        family_sigmas({"use_dynamic_shifting": True}, 4, grid="linear")
