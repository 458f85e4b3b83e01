"""A commit whose loss or gradient norm is not finite is refused: the optimizer is not stepped (weights and
AdamW state unchanged), the transaction is closed, the error names the step."""

from __future__ import annotations

import pytest
import torch

from digenrl.train.transaction import GradientTransaction


def _setup(max_grad_norm):
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    return net, opt, GradientTransaction(net.parameters(), opt, max_grad_norm=max_grad_norm)


def _backward(net, poison=None):
    loss = net(torch.ones(4, 3)).pow(2).mean()
    loss.backward()
    if poison is not None:
        net.weight.grad[0, 1] = poison
    return float(loss.detach())


@pytest.mark.parametrize("max_grad_norm", [1.0, None])
@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_a_non_finite_gradient_is_not_committed(max_grad_norm, poison):
    from digenrl.faults import RunHalted

    net, opt, tx = _setup(max_grad_norm)
    tx.begin(0)
    _backward(net)
    tx.commit()  # a good step first: AdamW has state
    before = {k: v.clone() for k, v in net.state_dict().items()}
    steps = int(opt.state[net.weight]["step"])
    tx.begin(1)
    _backward(net, poison)
    with pytest.raises(RunHalted, match=r"^step 2: gradient norm"):  # the scheduler's step 1, as a person counts
        tx.commit()
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert int(opt.state[net.weight]["step"]) == steps and tx.version == 1 and not tx.open
    assert all(p.grad is None for p in net.parameters())
    tx.begin(1)  # the transaction can be opened again
    _backward(net)
    assert torch.isfinite(torch.tensor(tx.commit()["grad_norm"]))


def test_a_non_finite_loss_is_not_committed():
    from digenrl.faults import RunHalted

    net, opt, tx = _setup(1.0)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    tx.begin(3)
    _backward(net)
    with pytest.raises(RunHalted, match=r"^step 4: loss"):  # numbered from 1, as the progress line
        tx.commit(loss=float("nan"))
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items()) and not opt.state and not tx.open


def test_fp16_overflow_still_skips_the_step_without_error():
    """Dynamic loss scaling: an fp16 overflow is expected and skipped (scale backed off), not a fault."""
    from digenrl.train.precision import Precision

    net, opt, tx = _setup(1.0)
    tx.precision = Precision("fp16", device_type="cpu", scale=1024.0)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    tx.begin(0)
    _backward(net, float("inf"))
    tx.commit()
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items()) and tx.precision.skipped == 1
