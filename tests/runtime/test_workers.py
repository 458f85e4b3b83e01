"""The worker classes in-process (no Ray): TAG leaves the transaction alone; any worker makes the same samples."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import make_cfg

from digenrl.schedule import Chunk, Fragment

REWARDS = {0: (0.1, 0.9, 0.4, 0.7)}  # the step's complete groups' rewards, as the executor passes them


@pytest.fixture
def workers(tiny_model, tmp_path):
    from digenrl.runtime.generator import GeneratorWorker
    from digenrl.runtime.trainer import TrainerWorker

    conf = make_cfg(tiny_model, tmp_path, "runtime.mode=gap_tsp_tag").model_dump(mode="json")
    gen, trn = GeneratorWorker("gen0", conf), TrainerWorker("trn0", conf, rank=0)
    gen.version = 0  # both built from the same weights file (the runtime publishes version 0 instead)
    return gen, trn


def test_tag_never_touches_gradients_or_optimizer(workers):
    from digenrl.train.step_math import assign_advantages

    gen, trn = workers
    group, _ = gen.generate(Fragment(0, 0, (0, 1, 2, 3)), 0)
    group.rewards = torch.tensor(REWARDS[0])
    assign_advantages(group)
    trn._groups[(0, 0)] = group  # as if fetched from the object store
    trn.train(Chunk(0, 0, ((0, 0), (1, 0), (2, 1))), [], REWARDS, {})
    grads = {n: p.grad.clone() for n, p in trn.policy.named_parameters() if p.grad is not None}
    assert grads and trn.tx.open
    opt_state = {k: {kk: vv.clone() if torch.is_tensor(vv) else vv for kk, vv in v.items()}
                 for k, v in trn.ctx.optimizer.state.items()}
    weights = {n: p.detach().clone() for n, p in trn.policy.named_parameters()}

    tag, info = trn.generate(Fragment(0, 1, (2, 3)), 0)  # TAG with the uncommitted (= version 0) weights
    assert info.version == 0 and tag.version.tolist() == [0, 0] and tag.images is None
    for n, p in trn.policy.named_parameters():
        assert torch.equal(p.detach(), weights[n])
        assert (p.grad is None) == (n not in grads) and (p.grad is None or torch.equal(p.grad, grads[n])), n
    assert set(trn.ctx.optimizer.state) == set(opt_state)
    assert trn.tx.open and trn.tx.step == 0  # the transaction is still the step's, untouched
    with pytest.raises(RuntimeError, match="on-policy"):
        trn.generate(Fragment(0, 1, (0,)), 1)

    # I5: the trainer's TAG samples equal what the generator makes for the same generations
    ref, ref_info = gen.generate(Fragment(0, 1, (0, 1, 2, 3)), 0)
    torch.testing.assert_close(tag.latents, ref.latents[2:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tag.log_probs, ref.log_probs[2:], rtol=1e-5, atol=1e-5)
    assert info.rewards == pytest.approx(ref_info.rewards[2:], rel=1e-4, abs=1e-6)


def test_trainer_refuses_cells_twice_and_wrong_versions(workers):
    from digenrl.train.transaction import TransactionError

    gen, trn = workers
    group, _ = gen.generate(Fragment(0, 0, (0, 1, 2, 3)), 0)
    group.rewards = torch.tensor(REWARDS[0])
    from digenrl.train.step_math import assign_advantages

    assign_advantages(group)
    trn._groups[(0, 0)] = group
    trn.train(Chunk(0, 0, ((0, 0),)), [], REWARDS, {})
    with pytest.raises(TransactionError, match="twice"):  # I2
        trn.train(Chunk(0, 0, ((0, 0),)), [], REWARDS, {})
    with pytest.raises(RuntimeError, match="version"):     # a chunk of a step the weights are not at
        trn.train(Chunk(1, 0, ((0, 0),)), [], REWARDS, {})
    assert trn.abort() == 0 and not trn.tx.open
    with pytest.raises(RuntimeError, match="never published"):
        gen.generate(Fragment(1, 0, (0,)), 1)
