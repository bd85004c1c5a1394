"""Diagonal-Gaussian chunk math shared by the policy and the learner: per-position log-densities, the log-prob of
an executed span (a mask over chunk positions) and the entropy over that span."""
from __future__ import annotations

import math

import torch

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def log_prob_steps(mean: torch.Tensor, log_std: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
    """(B, H): log N(chunk | mean, exp(log_std)^2) summed over action dims; log_std (H, A) or (B, H, A)."""
    z = (chunk - mean) * torch.exp(-log_std)
    return (-0.5 * z * z - log_std - _HALF_LOG_2PI).sum(-1)


def _check_mask(mask: torch.Tensor, shape: tuple[int, ...]) -> None:
    if mask.dtype != torch.bool or tuple(mask.shape) != tuple(shape):
        raise ValueError(f"mask must be bool {tuple(shape)} (True = executed position), got {mask.dtype} "
                         f"{tuple(mask.shape)}")


def log_prob(mean: torch.Tensor, log_std: torch.Tensor, chunk: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,): sum of Gaussian log-densities over the positions where mask (B, H) is True, all action dims.

    Masked-out entries of `chunk` may hold anything (NaN padding included): they are replaced before any
    arithmetic, so neither the value nor the gradient can see them."""
    _check_mask(mask, mean.shape[:2])
    safe = torch.where(mask[..., None], chunk, mean.detach())  # (B, H, A)
    steps = log_prob_steps(mean, log_std, safe)  # (B, H)
    return torch.where(mask, steps, torch.zeros((), dtype=steps.dtype, device=steps.device)).sum(-1)


def entropy(log_std: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,): Gaussian entropy (0.5 + 0.5 log 2π + log σ per dim) summed over masked-in positions and dims."""
    _check_mask(mask, (mask.shape[0], log_std.shape[-2]))
    steps = (0.5 + _HALF_LOG_2PI + log_std).sum(-1).expand(mask.shape)  # (B, H)
    return torch.where(mask, steps, torch.zeros((), dtype=steps.dtype, device=steps.device)).sum(-1)
