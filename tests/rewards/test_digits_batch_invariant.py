"""The digits reward scores a sample the same, bit for bit, whatever batch it comes in (a generator scores a
whole fragment, a TAG rank its share of one): the CPU kernels of the classifier round differently with the batch
size, so it classifies each slot alone (issue 40: two clean runs with gang TAG differed by that alone)."""

import torch

from digenrl.rewards.digits import DigitsReward
from digenrl.tasks.digits import DigitsTask


def test_digits_reward_does_not_depend_on_the_batch():
    torch.manual_seed(0)
    images = torch.rand(7, 1, 8, 16)
    prompts = DigitsTask().train_prompts(0, 7, 0)
    r = DigitsReward()
    whole = r(images, prompts)
    for i in range(7):
        assert torch.equal(r(images[i:i + 1], prompts[i:i + 1])[0], whole[i]), i
    assert torch.equal(r(images[2:5], prompts[2:5]), whole[2:5])
