"""The trainer's loss (trainer/loss.py): one function for both backends and every kernel."""

import pytest
import torch
import torch.nn.functional as F

from kfp_sagemaker_blackwell.trainer import loss


def test_cross_entropy_is_fp32_mean_over_every_token():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=torch.bfloat16)
    targets = torch.randint(0, 11, (2, 5))
    got = loss.lm_loss(logits, targets)
    assert got.dtype == torch.float32
    want = F.cross_entropy(logits.float().reshape(10, 11), targets.reshape(10))
    assert torch.equal(got, want)


def test_bare_stack_uses_mean_square_and_keeps_gradients():
    x = torch.full((2, 3, 4), 2.0, requires_grad=True)
    got = loss.lm_loss(x, None)
    assert got.item() == pytest.approx(4.0)
    got.backward()
    assert x.grad is not None and torch.allclose(x.grad, torch.full_like(x, 4.0 / 24))


def test_compiled_kernel_off_cuda_gives_the_eager_value():
    logits = torch.randn(3, 4, 7)
    targets = torch.randint(0, 7, (3, 4))
    assert torch.equal(loss.lm_loss(logits, targets, kernel="compiled"), loss.lm_loss(logits, targets, "eager"))


def test_unknown_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="loss kernel 'fused'.*compiled, eager"):
        loss.lm_loss(torch.zeros(1, 1, 2), torch.zeros(1, 1, dtype=torch.long), kernel="fused")
