"""Large random weights for tests: a freshly initialised model has flat output distributions (std 0.02), so a
wrong memory, mask or position term barely moves them; these make such mistakes change the tokens."""

import torch


@torch.no_grad()
def perturbed(model, std=0.3):
    """Add N(0, std) to every parameter (in `model.parameters()` order, so a seeded draw is reproducible)."""
    for param in model.parameters():
        param.add_(torch.randn_like(param) * std)
    return model


@torch.no_grad()
def peaked(model):
    """Every parameter drawn from N(0, 0.2), layer-norm weights from 1 + N(0, 0.1) (issue 12's XLNet example)."""
    for name, param in model.named_parameters():
        is_norm_weight = "layer_norm" in name and name.endswith("weight")
        param.copy_(1 + 0.1 * torch.randn_like(param) if is_norm_weight else 0.2 * torch.randn_like(param))
    return model
