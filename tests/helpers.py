"""Checks shared by several test modules (pytest puts this folder on sys.path)."""

import torch
from torch import nn


def assert_gradients_reach_every_parameter(module: nn.Module) -> None:
    """After a backward pass, every parameter of `module` has a finite gradient above 1e-6,
    except the attention key biases: W^K's bias adds q·b to every score of a query, which the
    softmax ignores, so their gradient is zero up to rounding, whatever the loss."""
    for name, p in module.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if name.endswith("attn.w_k.bias"):
            assert p.grad.abs().max() < 1e-5, name
        else:
            assert p.grad.abs().max() > 1e-6, name
