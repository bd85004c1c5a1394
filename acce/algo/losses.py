"""Policy, value and entropy losses for the off-policy-corrected chunk learner (docs/design.md §4, §5).

Three policies appear in an asynchronous update:

- behaviour ``mu``: the weights (``behavior_version``) that sampled the chunk; ``logp_behavior`` is stamped by the
  actor, over the executed span only (docs/design.md §5 item 2),
- proximal ``pi_prox``: the learner's weights at the start of this update (detached); it anchors the trust region,
- current ``pi_new``: the weights being optimized.

Decoupling the two roles (Hilton et al. 2021) keeps the trust region a statement about *this* update while
staleness is corrected by a truncated importance weight ``w = min(is_cap, pi_prox / mu)``; with zero staleness
(prox == behaviour) ``w = 1`` and the losses reduce to their synchronous forms (lessons: "async at zero
staleness must reproduce the synchronous run").

Every per-sample input is (...,) (e.g. (B, T) or (N,)); all inputs of one call share one shape. ``mask`` (bool,
same shape, optional) marks samples that get a policy-gradient term: False for decisions whose executed action was
not sampled from the policy (safety clamp, human intervention, docs/design.md §5 item 4) and for padding. Masked
entries may hold any value (even NaN/inf): they are replaced before any arithmetic so neither the loss nor its
gradient can be poisoned. Stats are floats over the unmasked samples (0.0 when there are none).
"""
from __future__ import annotations

import math

import torch

__all__ = ["importance_log_ratio", "decoupled_ppo_loss", "gipo_loss", "value_loss", "entropy_bonus"]


def _check_same_shape(**tensors: torch.Tensor | None) -> None:
    """Fail loudly instead of broadcasting: (B, 1) against (B,) would silently build a (B, B) loss."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items() if t is not None}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"inputs must share one shape; got {shapes}")


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """exp of a log-ratio in bf16/fp16 loses the precision the ratio statistics need; compute in float32."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _fill(mask: torch.Tensor | None, x: torch.Tensor, fill: torch.Tensor | float) -> torch.Tensor:
    """Replace masked-out entries before arithmetic (a NaN there would otherwise reach the gradient)."""
    return x if mask is None else torch.where(mask, x, fill)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return x.mean()
    # Entries outside the mask were already filled with finite values; the where keeps them out of the sum.
    return torch.where(mask, x, torch.zeros_like(x)).sum() / mask.sum().clamp_min(1)


def _valid(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(n,) flat detached values of the samples that count for statistics."""
    x = x.detach()
    return x.reshape(-1) if mask is None else x[mask]


def _ess(weights: torch.Tensor) -> float:
    """Normalized effective sample size (sum w)^2 / (n * sum w^2) in (0, 1]; 1 means uniform weights."""
    if weights.numel() == 0:
        return 0.0
    denom = weights.numel() * (weights * weights).sum()
    return float(weights.sum() ** 2 / denom) if float(denom) > 0 else 0.0


def _stat(fn, x: torch.Tensor) -> float:
    return float(fn(x)) if x.numel() else 0.0


def _check_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    return mask


def importance_log_ratio(logp_new: torch.Tensor, logp_behavior: torch.Tensor) -> torch.Tensor:
    """``log pi_new(a|s) - log mu(a|s)``, e.g. V-trace's ``log_rhos``.

    Args:
        logp_new: (...,) log-prob of the executed span under the policy being evaluated.
        logp_behavior: (...,) log-prob stamped by the actor that sampled it (detached: it is data).
    Returns:
        (...,) log importance ratio; gradients flow only through ``logp_new``.
    """
    _check_same_shape(logp_new=logp_new, logp_behavior=logp_behavior)
    return _upcast(logp_new) - _upcast(logp_behavior).detach()


def _off_policy_weights(logp_prox: torch.Tensor, logp_behavior: torch.Tensor,
                        is_cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated weight ``min(is_cap, pi_prox / mu)`` (detached) and where the truncation was active.

    Truncation is decided in log space so a huge log-ratio cannot overflow to inf before the cap is applied.
    """
    log_w = (logp_prox - logp_behavior).detach()
    log_cap = math.log(is_cap) if math.isfinite(is_cap) else math.inf
    truncated = log_w > log_cap
    return torch.exp(torch.clamp(log_w, max=log_cap)), truncated


def _common_stats(ratio: torch.Tensor, log_ratio: torch.Tensor, weights: torch.Tensor, truncated: torch.Tensor,
                  mask: torch.Tensor | None) -> dict[str, float]:
    r, lr, w = _valid(ratio, mask), _valid(log_ratio, mask), _valid(weights, mask)
    return {
        "is/ratio_mean": _stat(torch.mean, r),
        "is/ratio_max": _stat(torch.max, r),
        # k3 estimator of KL(pi_prox || pi_new) (Schulman): non-negative and unbiased for samples from prox.
        "is/approx_kl": _stat(torch.mean, (r - 1.0) - lr),
        "is/weight_mean": _stat(torch.mean, w),
        "is/weight_max": _stat(torch.max, w),
        "is/trunc_frac": _stat(torch.mean, _valid(truncated, mask).float()),
        "is/ess": _ess(w),
    }


def _prepare(logp_new, logp_prox, logp_behavior, advantages, is_cap, mask):
    _check_same_shape(logp_new=logp_new, logp_prox=logp_prox, logp_behavior=logp_behavior,
                      advantages=advantages, mask=mask)
    if not is_cap > 0.0:
        raise ValueError(f"is_cap must be positive (math.inf disables truncation), got {is_cap}")
    mask = _check_mask(mask)
    # prox, behaviour and advantages are data for this update: no gradient may flow into them.
    logp_new = _upcast(logp_new)
    logp_prox = _fill(mask, _upcast(logp_prox).detach(), 0.0)
    logp_behavior = _fill(mask, _upcast(logp_behavior).detach(), logp_prox)
    logp_new = _fill(mask, logp_new, logp_prox)  # log-ratio 0 where masked: finite, no gradient
    advantages = _fill(mask, _upcast(advantages).detach(), 0.0)
    return logp_new, logp_prox, logp_behavior, advantages, mask


def decoupled_ppo_loss(logp_new: torch.Tensor, logp_prox: torch.Tensor, logp_behavior: torch.Tensor,
                       advantages: torch.Tensor, clip_eps: float = 0.2, is_cap: float = 2.0,
                       mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO-clip (Hilton et al. 2021, "Batch size-invariance for policy optimization").

    ``r = exp(logp_new - logp_prox)``, ``w = min(is_cap, exp(logp_prox - logp_behavior))`` (detached),
    ``loss = -mean(w * min(r * A, clip(r, 1 - eps, 1 + eps) * A))``.

    The clip is the trust region around the proximal policy; ``w`` corrects for the data having been sampled by
    the (stale) behaviour policy, truncated like V-trace's rho so one stale sample cannot dominate. When
    ``logp_prox == logp_behavior`` this is exactly standard PPO-clip.

    Args:
        logp_new: (...,) log-prob of the executed span under the current weights (carries the gradient).
        logp_prox: (...,) same under the weights at the start of this update (detached here).
        logp_behavior: (...,) same under the behaviour weights, stamped by the actor (detached here).
        advantages: (...,) advantage estimates (detached here; normalize before calling if desired).
        clip_eps: trust-region half-width epsilon in (0, 1).
        is_cap: truncation of the off-policy weight (``math.inf``: untruncated).
        mask: optional (...,) bool, True where the sample gets a policy-gradient term.
    Returns:
        loss: scalar tensor to minimize.
        stats: "is/ratio_mean", "is/ratio_max" (of r), "is/clip_frac" (fraction where the clipped term was the
            smaller one, i.e. the sample's gradient was cut), "is/weight_mean", "is/weight_max", "is/ess" (of w),
            "is/trunc_frac" (fraction where w hit is_cap), "is/approx_kl" (KL(prox || new) estimate).
    """
    if not 0.0 < clip_eps < 1.0:
        raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps}")
    logp_new, logp_prox, logp_behavior, advantages, mask = _prepare(
        logp_new, logp_prox, logp_behavior, advantages, is_cap, mask)
    log_ratio = logp_new - logp_prox  # (...,)
    ratio = torch.exp(log_ratio)
    weights, truncated = _off_policy_weights(logp_prox, logp_behavior, is_cap)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = -_masked_mean(weights * torch.minimum(unclipped, clipped), mask)

    stats = _common_stats(ratio, log_ratio, weights, truncated, mask)
    # Strictly smaller: at A = 0 or inside the region both terms tie and the gradient is not cut.
    stats["is/clip_frac"] = _stat(torch.mean, _valid(clipped < unclipped, mask).float())
    return loss, stats


def gipo_loss(logp_new: torch.Tensor, logp_prox: torch.Tensor, logp_behavior: torch.Tensor,
              advantages: torch.Tensor, sigma: float = 0.5, is_cap: float = 2.0,
              mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """GIPO: PPO's hard clip replaced by a Gaussian trust weight in log-ratio space.

    ``r = exp(logp_new - logp_prox)``, ``g = exp(-(log r)^2 / (2 sigma^2))`` (detached),
    ``w = min(is_cap, exp(logp_prox - logp_behavior))`` (detached), ``loss = -mean(w * g * r * A)``.

    The gradient w.r.t. ``logp_new`` is ``-w * g * r * A / n``: a sample whose ratio drifted far from 1 is damped
    smoothly (g = 1 at r = 1, symmetric in log r, 0.61 at |log r| = sigma, 0.14 at 2 sigma) but never cut to a
    hard zero the way PPO's clip does. ``g * r`` is evaluated as ``exp(log r - (log r)^2 / (2 sigma^2))`` with the
    quadratic term detached: same value and gradient, but finite even where r alone would overflow
    (float32 underflows g to 0 only past |log r| ~ 13 sigma).

    Source: GIPO, "Gaussian Importance Sampling Policy Optimization" (Lu et al., arXiv:2603.03955), used by
    AcceRL (arXiv:2603.18464). The reference code (github.com/distanceLu/AcceRL,
    ``AccRL/minimal_modelfree_GIPO/main_ray_gipo.py``, "Gaussian-smoothed Trust Region Soft Clipping") computes
    ``coeff = exp(-0.5 * (log(r.detach()) / sigma)^2)`` and maximizes ``mean(r * A * coeff)`` with r taken
    against the *behaviour* policy and sigma = 0.5 by default. Here that ratio is split in the decoupled way:
    the Gaussian is centred on the proximal policy and staleness is handled by the truncated weight w. With
    prox == behaviour (w = 1) this is exactly the reference objective.

    Args:
        logp_new, logp_prox, logp_behavior, advantages, is_cap, mask: as in `decoupled_ppo_loss`.
        sigma: width of the trust weight in log-ratio units (> 0); smaller is a tighter trust region.
    Returns:
        loss: scalar tensor to minimize.
        stats: the `decoupled_ppo_loss` keys except "is/clip_frac" (there is no hard clip), plus
            "is/trust_mean" and "is/trust_min" (of g).
    """
    if not sigma > 0.0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    logp_new, logp_prox, logp_behavior, advantages, mask = _prepare(
        logp_new, logp_prox, logp_behavior, advantages, is_cap, mask)
    log_ratio = logp_new - logp_prox  # (...,)
    log_trust = -log_ratio.detach() ** 2 / (2.0 * sigma ** 2)  # (...,) log g, detached
    trusted_ratio = torch.exp(log_ratio + log_trust)  # (...,) g * r with d/dlogp_new = g * r
    weights, truncated = _off_policy_weights(logp_prox, logp_behavior, is_cap)
    loss = -_masked_mean(weights * trusted_ratio * advantages, mask)

    stats = _common_stats(torch.exp(log_ratio.detach()), log_ratio, weights, truncated, mask)
    trust = _valid(torch.exp(log_trust), mask)
    stats["is/trust_mean"] = _stat(torch.mean, trust)
    stats["is/trust_min"] = _stat(torch.min, trust)
    return loss, stats


def value_loss(values: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor | None = None,
               clip: float | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``0.5 * mean((values - returns)^2)``, optionally PPO-style clipped around ``old_values``.

    With ``clip``: ``v_clip = old_values + clamp(values - old_values, -clip, clip)`` and the per-sample loss is
    the larger of the clipped and unclipped squared errors (pessimistic, as in PPO2/CleanRL), so the value head
    cannot move further than ``clip`` from the values the advantages were computed with.

    Args:
        values: (...,) current value predictions (carry the gradient).
        returns: (...,) targets from `gae` / `vtrace` (detached here).
        old_values: (...,) predictions at data time; required when ``clip`` is set, otherwise unused.
        clip: clip range in value units, or None for the plain squared error.
        mask: optional (...,) bool of samples that count (e.g. padding False). Values of intervened steps still
            count (docs/design.md §5 item 4).
    Returns:
        scalar loss tensor.
    """
    _check_same_shape(values=values, returns=returns, old_values=old_values, mask=mask)
    mask = _check_mask(mask)
    if clip is not None and old_values is None:
        raise ValueError("value_loss(clip=...) needs old_values (the predictions the returns were computed with)")
    if clip is not None and not clip > 0.0:
        raise ValueError(f"value clip must be positive, got {clip}")
    values = _fill(mask, _upcast(values), 0.0)
    returns = _fill(mask, _upcast(returns).detach(), 0.0)
    err = (values - returns) ** 2
    if clip is not None:
        old_values = _fill(mask, _upcast(old_values).detach(), 0.0)
        clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err = torch.maximum(err, (clipped - returns) ** 2)
    return 0.5 * _masked_mean(err, mask)


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean per-sample entropy; the learner subtracts ``coef * entropy_bonus(...)`` from its loss.

    Args:
        entropy: (...,) entropy of the executed-span action distribution (or its one-sample estimate
            ``-logp_new`` where no closed form exists, e.g. flow/diffusion heads).
        mask: optional (...,) bool, as for the policy losses.
    Returns:
        scalar tensor (positive for a spread-out policy).
    """
    mask = _check_mask(mask)
    _check_same_shape(entropy=entropy, mask=mask)
    return _masked_mean(_fill(mask, _upcast(entropy), 0.0), mask)


def gaussian_kl(mean_p: torch.Tensor, log_std_p: torch.Tensor, mean_q: torch.Tensor,
                log_std_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) of diagonal Gaussians, summed over the last (action) axis and averaged over the rest:
    log σq/σp + (σp² + (μp − μq)²) / (2 σq²) − ½ per dim. Log-stds broadcast against the means (a learned
    per-position log_std (H, A) against means (B, H, A))."""
    _check_same_shape(mean_p=mean_p, mean_q=mean_q)
    mean_p, mean_q = _upcast(mean_p), _upcast(mean_q)
    log_std_p, log_std_q = _upcast(log_std_p).expand_as(mean_p), _upcast(log_std_q).expand_as(mean_p)
    var_q = torch.exp(2.0 * log_std_q)
    per_dim = log_std_q - log_std_p + (torch.exp(2.0 * log_std_p) + (mean_p - mean_q) ** 2) / (2.0 * var_q) - 0.5
    return per_dim.sum(-1).mean()


def aux_regression_loss(pred: torch.Tensor, labels, mean, std) -> torch.Tensor:
    """mean(((labels - mean) / std - pred)^2): the aux head's loss on raw privileged labels (B, P) (arrays or
    tensors), standardized with the cloning statistics (P,) the head was first trained under, so RL keeps the scale
    that the policy reads back when policy.aux_input."""
    if labels is None:
        raise ValueError("the rollouts carry no privileged aux labels (obs['aux']): learner.aux_coef > 0 needs "
                         "policy.critic=privileged, whose training envs record them")
    labels, mean, std = (torch.as_tensor(v, device=pred.device) for v in (labels, mean, std))
    _check_same_shape(pred=pred, labels=labels)
    target = ((_upcast(labels) - _upcast(mean)) / _upcast(std)).detach()
    return ((_upcast(pred) - target) ** 2).mean()


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns): 1 = the critic predicts the targets, <= 0 = no better than the mean"""
    var = float(returns.var()) if returns.numel() > 1 else 0.0
    return 1.0 - float((returns - values).var()) / var if var > 0 else 0.0
