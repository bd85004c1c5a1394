"""Per-decision returns for a chunk-level actor-critic (docs/design.md §5 "Delay-aware learning").

A segment is T consecutive decisions k = 0..T-1 of one env; time is the LAST axis, so every function takes
(T,) or (..., T) (a leading batch of segments, e.g. (B, T)) and treats rows independently.

Credit is semi-Markov: decision k owns the rewards of the control steps its actions ran (its executed span), so
the caller passes, per decision,

- ``rewards[k]   = sum_j gamma^j r_{t_k + j}`` over the executed span (see `semi_markov_reward`),
- ``discounts[k] = gamma^{span_k} * (1 - terminated_k)``: the bootstrap discount to the next decision,
- ``next_values[k]``: V of the state after decision k (decision k+1's observation, the final observation of a
  truncated episode, or the segment's bootstrap observation),
- ``episode_ends[k]``: a new episode starts after decision k. The lambda/trace recursion is cut there, but
  ``next_values[k]`` still bootstraps through ``discounts[k]`` (0 for a termination, gamma^span for a truncation).

Passing ``next_values`` explicitly (instead of shifting ``values``) is what makes truncation correct: V of the
final observation of a truncated episode is not V of the next episode's first observation.

All outputs are regression/advantage *targets*: they are computed without autograd and returned detached.
"""
from __future__ import annotations

import torch

__all__ = ["semi_markov_reward", "gae", "vtrace"]


def semi_markov_reward(step_rewards: torch.Tensor, span_len: torch.Tensor,
                       gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Discounted reward of one executed span and the bootstrap discount that follows it.

    Args:
        step_rewards: (..., L) per-control-step rewards, position j = j-th executed step of the decision;
            positions j >= span_len are padding and ignored (they may hold anything finite).
        span_len: (...,) integer number of executed steps, 0 <= span_len <= L.
        gamma: per-control-step discount in [0, 1].
    Returns:
        reward: (...,) ``sum_{j < span_len} gamma^j * step_rewards[..., j]``
        discount_factor: (...,) ``gamma ** span_len``; the caller multiplies by ``1 - terminated``.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if step_rewards.dim() < 1 or step_rewards.shape[:-1] != span_len.shape:
        raise ValueError(f"step_rewards (..., L) and span_len (...,) disagree: {tuple(step_rewards.shape)} vs "
                         f"{tuple(span_len.shape)}")
    if span_len.dtype.is_floating_point or span_len.dtype == torch.bool:
        raise ValueError(f"span_len must be an integer tensor, got {span_len.dtype}")
    length = step_rewards.shape[-1]
    if span_len.numel() and (int(span_len.min()) < 0 or int(span_len.max()) > length):
        raise ValueError(f"span_len must be in [0, {length}], got min {int(span_len.min())} "
                         f"max {int(span_len.max())}")
    with torch.no_grad():
        dtype = step_rewards.dtype if step_rewards.dtype.is_floating_point else torch.float32
        j = torch.arange(length, device=step_rewards.device)  # (L,)
        powers = torch.full((length,), gamma, dtype=dtype, device=step_rewards.device) ** j  # (L,) gamma^j
        inside = j < span_len.unsqueeze(-1)  # (..., L): padding beyond the span contributes nothing
        # torch.where (not multiply) so NaN/inf in padding cannot leak into the sum.
        terms = torch.where(inside, step_rewards.to(dtype) * powers, 0.0)
        reward = terms.sum(-1)
        discount_factor = torch.full_like(reward, gamma) ** span_len.to(dtype)
    return reward, discount_factor


def _check_same_shape(**tensors: torch.Tensor) -> None:
    """Fail loudly instead of broadcasting: (B, 1) against (B,) would silently mix segments."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"inputs must share one shape (..., T); got {shapes}")
    shape = next(iter(shapes.values()))
    if shape == () or shape[-1] == 0:
        raise ValueError(f"inputs need a non-empty time axis: (T,) or (..., T); got {shape}")


def gae(rewards: torch.Tensor, discounts: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
        episode_ends: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over decisions with per-decision discounts.

    ``delta_k = r_k + discounts_k * next_values_k - values_k``
    ``A_k = delta_k + discounts_k * lam * A_{k+1} * (1 - episode_ends_k)``,  ``A_T = 0``

    ``discounts`` already contains gamma^span, so gamma is applied per control step while ``lam`` is applied once
    per *decision* (not per control step): a chunk is one unit of credit assignment.

    Args:
        rewards, discounts, values, next_values: (..., T) floating tensors.
        episode_ends: (..., T) bool, True where a new episode starts after decision k.
        lam: GAE lambda in [0, 1].
    Returns:
        advantages: (..., T) detached.
        returns: (..., T) ``advantages + values`` (the lambda-return value target), detached.
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    _check_same_shape(rewards=rewards, discounts=discounts, values=values, next_values=next_values,
                      episode_ends=episode_ends)
    with torch.no_grad():
        keep = 1.0 - episode_ends.to(values.dtype)  # (..., T) 0 cuts the lambda recursion
        deltas = rewards + discounts * next_values - values  # (..., T)
        advantages = torch.empty_like(deltas)
        running = torch.zeros_like(deltas[..., 0])  # (...,) A_{k+1}
        for k in range(deltas.shape[-1] - 1, -1, -1):
            running = deltas[..., k] + discounts[..., k] * lam * keep[..., k] * running
            advantages[..., k] = running
        returns = advantages + values
    return advantages, returns


def vtrace(rewards: torch.Tensor, discounts: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
           episode_ends: torch.Tensor, log_rhos: torch.Tensor, rho_bar: float = 1.0, c_bar: float = 1.0,
           lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets (Espeholt et al. 2018, IMPALA) with per-decision discounts and explicit next values.

    With ``rho_k = min(rho_bar, exp(log_rhos_k))`` and ``c_k = lam * min(c_bar, exp(log_rhos_k))``:

    ``delta_k = rho_k * (r_k + discounts_k * next_values_k - values_k)``
    ``vs_k - values_k = delta_k + discounts_k * c_k * (vs_{k+1} - values_{k+1}) * (1 - episode_ends_k)``
    ``pg_advantages_k = rho_k * (r_k + discounts_k * vs_next_k - values_k)``

    where ``vs_next_k = vs_{k+1}`` when decision k+1 belongs to the same episode (k+1 < T and not
    episode_ends_k), else ``next_values_k``. On-policy (log_rhos = 0, rho_bar, c_bar >= 1) ``vs`` equals the
    GAE(lam) return; with lam = 1 it is the n-step discounted return bootstrapped at the segment end.

    Note: ``pg_advantages`` already carry the truncated importance weight rho_k. A loss that applies its own
    behaviour-policy weight (e.g. `acce.algo.losses.decoupled_ppo_loss`) should divide it out or use
    ``r + discounts * vs_next - values`` so the correction is not applied twice.

    Args:
        rewards, discounts, values, next_values: (..., T) floating tensors (values: behaviour-time or current V).
        episode_ends: (..., T) bool, True where a new episode starts after decision k.
        log_rhos: (..., T) ``log pi_target(a_k|s_k) - log mu_behavior(a_k|s_k)`` over the executed span.
        rho_bar: truncation of the delta weight (the fixed point's policy interpolates toward mu below 1).
        c_bar: truncation of the trace coefficient (controls contraction speed / variance).
        lam: extra trace discount in [0, 1] (lam < 1 mixes in shorter returns, as in GAE).
    Returns:
        vs: (..., T) value targets, detached.
        pg_advantages: (..., T) policy-gradient advantages, detached.
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    if rho_bar <= 0.0 or c_bar <= 0.0:
        raise ValueError(f"rho_bar and c_bar must be positive, got rho_bar={rho_bar} c_bar={c_bar}")
    _check_same_shape(rewards=rewards, discounts=discounts, values=values, next_values=next_values,
                      episode_ends=episode_ends, log_rhos=log_rhos)
    with torch.no_grad():
        ratios = torch.exp(log_rhos.to(values.dtype))  # (..., T)
        rhos = torch.clamp(ratios, max=rho_bar)
        cs = lam * torch.clamp(ratios, max=c_bar)
        keep = 1.0 - episode_ends.to(values.dtype)  # (..., T) 0 cuts the trace
        deltas = rhos * (rewards + discounts * next_values - values)
        vs_minus_v = torch.empty_like(deltas)
        running = torch.zeros_like(deltas[..., 0])  # (...,) vs_{k+1} - V_{k+1}
        for k in range(deltas.shape[-1] - 1, -1, -1):
            running = deltas[..., k] + discounts[..., k] * cs[..., k] * keep[..., k] * running
            vs_minus_v[..., k] = running
        vs = vs_minus_v + values
        # vs_{k+1} where k+1 continues the episode inside this segment, else the explicit bootstrap value.
        vs_shifted = torch.cat([vs[..., 1:], next_values[..., -1:]], dim=-1)  # (..., T)
        vs_next = torch.where(episode_ends.bool(), next_values, vs_shifted)
        pg_advantages = rhos * (rewards + discounts * vs_next - values)
    return vs, pg_advantages
