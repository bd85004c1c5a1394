"""Hand-computed checks of the learner math (acce/algo). Arithmetic for every expected number is in the comments."""
import math

import pytest
import torch

from acce.algo import (decoupled_ppo_loss, entropy_bonus, gae, gipo_loss, importance_log_ratio,
                       semi_markov_reward, value_loss, vtrace)

F, T = False, True


def t(*xs, dtype=torch.float64):
    return torch.tensor(xs, dtype=dtype)


def close(a, b, tol=1e-9):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                          atol=tol, rtol=0)


# --- semi-Markov reward ------------------------------------------------------------------------------------------

def test_semi_markov_reward_hand_numbers():
    # row 0: span 3 of 4 -> 1 + 0.9*2 + 0.81*3 = 1 + 1.8 + 2.43 = 5.23; discount 0.9^3 = 0.729 (the 100 is padding)
    # row 1: span 1      -> 5;                                         discount 0.9
    # row 2: span 0 (nothing of this chunk ran) -> 0;                  discount 1; NaN padding must not leak
    step_rewards = torch.tensor([[1.0, 2.0, 3.0, 100.0], [5.0, 7.0, 0.0, 0.0], [math.nan, 1.0, 1.0, 1.0]],
                                dtype=torch.float64)
    reward, discount = semi_markov_reward(step_rewards, torch.tensor([3, 1, 0]), 0.9)
    assert close(reward, t(5.23, 5.0, 0.0))
    assert close(discount, t(0.729, 0.9, 1.0))


def test_semi_markov_reward_batched_and_validated():
    step_rewards = torch.rand(2, 5, 4, dtype=torch.float64)
    span = torch.randint(0, 5, (2, 5))
    reward, discount = semi_markov_reward(step_rewards, span, 0.95)
    for b in range(2):
        rb, db = semi_markov_reward(step_rewards[b], span[b], 0.95)
        assert close(reward[b], rb) and close(discount[b], db)
    with pytest.raises(ValueError, match=r"span_len must be in \[0, 4\]"):
        semi_markov_reward(step_rewards, span + 5, 0.9)
    with pytest.raises(ValueError, match="integer"):
        semi_markov_reward(step_rewards, span.double(), 0.9)


# --- GAE ---------------------------------------------------------------------------------------------------------

REWARDS = t(1.0, 2.0, 3.0)
VALUES = t(0.5, 1.0, 2.0)


def test_gae_termination_in_the_middle():
    # Decision 1 terminates: discount 0, episode ends; decision 2 starts a new episode and bootstraps V=4.
    # delta0 = 1 + 0.9*1.0 - 0.5 = 1.4
    # delta1 = 2 + 0.0*2.0 - 1.0 = 1.0        (next value ignored: discount 0)
    # delta2 = 3 + 0.9*4.0 - 2.0 = 4.6
    # A2 = 4.6;  A1 = 1.0 + 0 (cut);  A0 = 1.4 + 0.9*0.8*1.0 = 2.12
    # returns = A + V = [2.62, 2.0, 6.6]
    adv, ret = gae(REWARDS, t(0.9, 0.0, 0.9), VALUES, t(1.0, 2.0, 4.0), torch.tensor([F, T, F]), lam=0.8)
    assert close(adv, t(2.12, 1.0, 4.6))
    assert close(ret, t(2.62, 2.0, 6.6))


def test_gae_truncation_in_the_middle_bootstraps_then_cuts():
    # Decision 1 ran a 2-step span (discount 0.9^2 = 0.81) and then the episode was truncated: it bootstraps from
    # V(final obs) = 3.0 but the lambda recursion does not reach into the next episode.
    # delta0 = 1 + 0.9*1.0  - 0.5 = 1.4
    # delta1 = 2 + 0.81*3.0 - 1.0 = 3.43
    # delta2 = 3 + 0.9*4.0  - 2.0 = 4.6
    # A2 = 4.6;  A1 = 3.43 (cut);  A0 = 1.4 + 0.9*0.8*3.43 = 1.4 + 2.4696 = 3.8696
    discounts, next_values = t(0.9, 0.81, 0.9), t(1.0, 3.0, 4.0)
    adv, ret = gae(REWARDS, discounts, VALUES, next_values, torch.tensor([F, T, F]), lam=0.8)
    assert close(adv, t(3.8696, 3.43, 4.6))
    assert close(ret, t(4.3696, 4.43, 6.6))
    # Without the episode end the recursion continues:
    # A1 = 3.43 + 0.81*0.8*4.6 = 3.43 + 2.9808 = 6.4108;  A0 = 1.4 + 0.72*6.4108 = 6.015776
    adv, _ = gae(REWARDS, discounts, VALUES, next_values, torch.tensor([F, F, F]), lam=0.8)
    assert close(adv, t(6.015776, 6.4108, 4.6))


def test_gae_rejects_broadcasting_shapes():
    with pytest.raises(ValueError, match="one shape"):
        gae(REWARDS, t(0.9, 0.9, 0.9), VALUES.unsqueeze(-1), t(1.0, 2.0, 4.0), torch.tensor([F, F, F]), lam=0.9)


# --- V-trace -----------------------------------------------------------------------------------------------------

def test_vtrace_on_policy_is_n_step_return():
    # log_rhos = 0, lam = 1, next_values[k] = values[k+1] inside the segment, bootstrap V = 4 at the end:
    # vs2 = 3 + 0.9*4    = 6.6
    # vs1 = 2 + 0.9*6.6  = 7.94
    # vs0 = 1 + 0.9*7.94 = 8.146
    # pg_adv_k = r_k + 0.9*vs_{k+1} - V_k = [1 + 7.146 - 0.5, 2 + 5.94 - 1, 3 + 3.6 - 2] = [7.646, 6.94, 4.6]
    discounts, next_values, ends = t(0.9, 0.9, 0.9), t(1.0, 2.0, 4.0), torch.tensor([F, F, F])
    vs, pg = vtrace(REWARDS, discounts, VALUES, next_values, ends, log_rhos=torch.zeros(3, dtype=torch.float64))
    assert close(vs, t(8.146, 7.94, 6.6))
    assert close(pg, t(7.646, 6.94, 4.6))
    adv, ret = gae(REWARDS, discounts, VALUES, next_values, ends, lam=1.0)
    assert close(vs, ret) and close(pg, adv)


@pytest.mark.parametrize("lam", [1.0, 0.7])
def test_vtrace_on_policy_equals_gae_with_episode_ends(lam):
    torch.manual_seed(0)
    b, n = 4, 9
    values = torch.randn(b, n, dtype=torch.float64)
    ends = torch.rand(b, n) < 0.3
    terminated = ends & (torch.rand(b, n) < 0.5)
    bootstrap = torch.randn(b, n, dtype=torch.float64)  # V(final obs) where an episode was truncated
    # Consistent inputs: inside an episode the next state's value is the next decision's value.
    next_values = torch.where(ends, bootstrap, torch.cat([values[:, 1:], torch.randn(b, 1).double()], dim=1))
    discounts = 0.9 ** torch.randint(1, 4, (b, n)).double() * (~terminated).double()
    rewards = torch.randn(b, n, dtype=torch.float64)
    vs, pg = vtrace(rewards, discounts, values, next_values, ends, torch.zeros(b, n).double(), lam=lam)
    adv, ret = gae(rewards, discounts, values, next_values, ends, lam=lam)
    assert close(vs, ret)  # vs - V follows the GAE(lam) recursion when rho = c/lam = 1
    if lam == 1.0:
        assert close(pg, adv)


def test_vtrace_clipped_ratios_hand_numbers():
    # ratios [2.0, 0.5, 1.5], rho_bar = c_bar = 1, lam = 1  ->  rho = c = [1, 0.5, 1]
    # raw deltas [1.4, 2.8, 4.6] (as in the GAE tests); weighted by rho: [1.4, 1.4, 4.6]
    # vs2 - V2 = 4.6                        -> vs2 = 6.6
    # vs1 - V1 = 1.4 + 0.9*0.5*4.6 = 3.47   -> vs1 = 4.47
    # vs0 - V0 = 1.4 + 0.9*1.0*3.47 = 4.523 -> vs0 = 5.023
    # pg0 = 1.0*(1 + 0.9*4.47 - 0.5) = 4.523;  pg1 = 0.5*(2 + 0.9*6.6 - 1) = 0.5*6.94 = 3.47;  pg2 = 4.6
    log_rhos = torch.log(t(2.0, 0.5, 1.5))
    vs, pg = vtrace(REWARDS, t(0.9, 0.9, 0.9), VALUES, t(1.0, 2.0, 4.0), torch.tensor([F, F, F]), log_rhos)
    assert close(vs, t(5.023, 4.47, 6.6))
    assert close(pg, t(4.523, 3.47, 4.6))


def test_vtrace_truncation_uses_next_value_not_next_episode():
    # Same ratios; decision 1 is truncated (discount 0.9, episode ends) with V(final obs) = 3.0.
    # delta1 = 0.5*(2 + 0.9*3.0 - 1) = 1.85;  vs1 - V1 = 1.85 (trace cut)    -> vs1 = 2.85
    # vs0 - V0 = 1.4 + 0.9*1.0*1.85 = 3.065                                 -> vs0 = 3.565;  vs2 = 6.6
    # pg0 = 1 + 0.9*2.85 - 0.5 = 3.065;  pg1 = 0.5*(2 + 0.9*3.0 - 1) = 1.85 (next_values[1], not vs2);  pg2 = 4.6
    log_rhos = torch.log(t(2.0, 0.5, 1.5))
    vs, pg = vtrace(REWARDS, t(0.9, 0.9, 0.9), VALUES, t(1.0, 3.0, 4.0), torch.tensor([F, T, F]), log_rhos)
    assert close(vs, t(3.565, 2.85, 6.6))
    assert close(pg, t(3.065, 1.85, 4.6))


def test_returns_are_detached_and_batched_rows_match():
    torch.manual_seed(1)
    shape = (3, 6)
    values = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    args = dict(rewards=torch.randn(shape).double(), discounts=torch.full(shape, 0.9).double(), values=values,
                next_values=torch.randn(shape).double(), episode_ends=torch.rand(shape) < 0.3)
    log_rhos = torch.randn(shape).double()
    adv, ret = gae(**args, lam=0.95)
    vs, pg = vtrace(**args, log_rhos=log_rhos, rho_bar=1.0, c_bar=0.9, lam=0.95)
    assert not any(x.requires_grad for x in (adv, ret, vs, pg))
    for b in range(shape[0]):
        row = {k: v[b] for k, v in args.items()}
        ab, rb = gae(**row, lam=0.95)
        vb, pb = vtrace(**row, log_rhos=log_rhos[b], rho_bar=1.0, c_bar=0.9, lam=0.95)
        assert close(adv[b], ab) and close(ret[b], rb) and close(vs[b], vb) and close(pg[b], pb)


# --- PPO / decoupled PPO -----------------------------------------------------------------------------------------

def ppo_reference(logp_new, logp_old, adv, eps):
    """Textbook PPO-clip, written independently of acce.algo."""
    ratio = torch.exp(logp_new - logp_old)
    return -torch.min(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv).mean()


def test_ppo_clip_hand_numbers_and_gradient_signs():
    # ratios r = [1.5, 1.1, 0.5, 1.5], A = [2, 2, -1, -1], eps = 0.2, prox == behaviour (w = 1):
    #   s0: min(3.0, 1.2*2 = 2.4)      = 2.4   clipped (no gradient)
    #   s1: min(2.2, 2.2)              = 2.2   inside
    #   s2: min(-0.5, 0.8*-1 = -0.8)   = -0.8  clipped (no gradient)
    #   s3: min(-1.5, 1.2*-1 = -1.2)   = -1.5  unclipped (pessimistic side keeps the gradient)
    # loss = -(2.4 + 2.2 - 0.8 - 1.5)/4 = -0.575; clip_frac = 2/4
    # d loss / d logp_new = -r*A/4 where unclipped: [0, -0.55, 0, +0.375]
    logp_new = torch.log(t(1.5, 1.1, 0.5, 1.5)).requires_grad_()
    zeros = torch.zeros(4, dtype=torch.float64)
    loss, stats = decoupled_ppo_loss(logp_new, zeros, zeros, t(2.0, 2.0, -1.0, -1.0), clip_eps=0.2)
    assert close(loss, -0.575)
    loss.backward()
    assert close(logp_new.grad, t(0.0, -0.55, 0.0, 0.375))
    assert stats["is/clip_frac"] == pytest.approx(0.5)
    assert stats["is/ratio_mean"] == pytest.approx((1.5 + 1.1 + 0.5 + 1.5) / 4)
    assert stats["is/ratio_max"] == pytest.approx(1.5)
    assert stats["is/weight_mean"] == stats["is/weight_max"] == stats["is/ess"] == pytest.approx(1.0)


def test_decoupled_ppo_equals_standard_ppo_when_prox_is_behavior():
    torch.manual_seed(2)
    logp_old = torch.randn(5, 7, dtype=torch.float64)
    logp_new = (logp_old + 0.3 * torch.randn(5, 7).double()).requires_grad_()
    adv = torch.randn(5, 7, dtype=torch.float64)
    loss, _ = decoupled_ppo_loss(logp_new, logp_old, logp_old, adv, clip_eps=0.2)
    (grad,) = torch.autograd.grad(loss, logp_new)
    ref = ppo_reference(logp_new, logp_old, adv, 0.2)
    (ref_grad,) = torch.autograd.grad(ref, logp_new)
    assert close(loss, ref) and close(grad, ref_grad)


def test_importance_weight_truncation_and_ess():
    # prox/behaviour = [3, 0.5] -> w = [min(2, 3), 0.5] = [2, 0.5]; r = 1 (new == prox) so surrogate = A = [1, 1]
    # loss = -(2*1 + 0.5*1)/2 = -1.25;  ESS = (2.5)^2 / (2 * (4 + 0.25)) = 6.25/8.5
    logp_prox = t(0.0, 0.0)
    logp_behavior = -torch.log(t(3.0, 0.5))
    loss, stats = decoupled_ppo_loss(logp_prox.clone().requires_grad_(), logp_prox, logp_behavior, t(1.0, 1.0),
                                     is_cap=2.0)
    assert close(loss, -1.25)
    assert stats["is/weight_max"] == pytest.approx(2.0)
    assert stats["is/weight_mean"] == pytest.approx(1.25)
    assert stats["is/trunc_frac"] == pytest.approx(0.5)
    assert stats["is/ess"] == pytest.approx(6.25 / 8.5)
    # A huge stale log-ratio is capped, not overflowed.
    loss, stats = decoupled_ppo_loss(t(0.0), t(0.0), t(-1e4), t(1.0), is_cap=2.0)
    assert close(loss, -2.0) and stats["is/weight_max"] == pytest.approx(2.0)
    assert close(importance_log_ratio(t(-1.0, 0.5), t(-2.0, 0.5)), t(1.0, 0.0))


def test_policy_gradient_does_not_flow_into_prox_behavior_or_advantages():
    logp = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    others = [torch.zeros(3, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    for fn in (decoupled_ppo_loss, gipo_loss):
        loss, _ = fn(logp, *others)
        grads = torch.autograd.grad(loss, [logp, *others], allow_unused=True)
        assert all(g is None or torch.all(g == 0) for g in grads[1:])


def test_mask_drops_samples_even_when_they_hold_nan():
    # Decision 1 was a human intervention: its log-probs are undefined (NaN here); the loss must equal the loss of
    # the remaining samples and the gradient must stay finite.
    logp_new = t(0.1, math.nan, -0.2).requires_grad_()
    prox, behavior, adv = t(0.0, math.nan, 0.0), t(-0.1, math.nan, 0.1), t(1.0, math.nan, -2.0)
    mask = torch.tensor([T, F, T])
    for fn in (decoupled_ppo_loss, gipo_loss):
        loss, stats = fn(logp_new, prox, behavior, adv, mask=mask)
        (grad,) = torch.autograd.grad(loss, logp_new)
        keep = mask.nonzero().squeeze(-1)
        sub = logp_new.detach()[keep].requires_grad_()
        ref, ref_stats = fn(sub, prox[keep], behavior[keep], adv[keep])
        (ref_grad,) = torch.autograd.grad(ref, sub)
        assert close(loss, ref) and torch.isfinite(grad).all()
        assert close(grad[keep], ref_grad) and grad[1] == 0
        assert stats == pytest.approx(ref_stats)
    loss, stats = decoupled_ppo_loss(t(0.0), t(0.0), t(0.0), t(1.0), mask=torch.tensor([F]))
    assert loss.item() == 0.0 and stats["is/ess"] == 0.0


# --- GIPO --------------------------------------------------------------------------------------------------------

def test_gipo_trust_weight_is_one_at_ratio_one_and_symmetric_in_log_ratio():
    sigma = 0.5
    x = t(0.0, 0.1, -0.1, 0.5, -0.5, 1.0, -1.0)  # log r
    trust = []
    for xi in x:
        _, stats = gipo_loss(xi.view(1), t(0.0), t(0.0), t(1.0), sigma=sigma)
        trust.append(stats["is/trust_mean"])
    assert trust[0] == pytest.approx(1.0)
    assert trust[1] == pytest.approx(trust[2]) and trust[3] == pytest.approx(trust[4])
    assert trust[5] == pytest.approx(trust[6])
    assert 1.0 > trust[1] > trust[3] > trust[5] > 0.0
    # g(log r = sigma) = exp(-1/2)
    assert trust[3] == pytest.approx(math.exp(-0.5))


def test_gipo_hand_numbers_gradient_and_reference_form():
    # sigma = 0.5, log r = 0.5, A = 2: g = exp(-0.25/(2*0.25)) = exp(-0.5); r = exp(0.5); g*r = exp(0) = 1
    # loss = -(w=1) * 1 * 2 = -2;  d loss / d logp_new = -g*r*A = -2 (positive advantage: push logp up)
    logp_new = t(0.5).requires_grad_()
    loss, stats = gipo_loss(logp_new, t(0.0), t(0.0), t(2.0), sigma=0.5)
    loss.backward()
    assert close(loss, -2.0) and close(logp_new.grad, t(-2.0))
    assert stats["is/ratio_max"] == pytest.approx(math.exp(0.5))
    # Negative advantage: gradient pushes logp down (positive d loss / d logp).
    logp_new = t(-0.3).requires_grad_()
    gipo_loss(logp_new, t(0.0), t(0.0), t(-1.0))[0].backward()
    assert logp_new.grad.item() > 0
    # Reference form (AcceRL, ratio against behaviour, prox == behaviour):
    # loss = -mean(r * A * exp(-0.5 * (log r.detach() / sigma)^2))
    torch.manual_seed(3)
    old = torch.randn(16, dtype=torch.float64)
    new = (old + 0.5 * torch.randn(16).double()).requires_grad_()
    adv = torch.randn(16, dtype=torch.float64)
    loss, _ = gipo_loss(new, old, old, adv, sigma=0.5)
    ratio = torch.exp(new - old)
    ref = -(ratio * adv * torch.exp(-0.5 * (torch.log(ratio.detach()) / 0.5) ** 2)).mean()
    g, g_ref = torch.autograd.grad(loss, new)[0], torch.autograd.grad(ref, new)[0]
    assert close(loss, ref) and close(g, g_ref)


def test_gipo_never_hard_zero_and_finite_for_extreme_ratios():
    # |log r| = 2 sigma: PPO with eps 0.2 would give zero gradient for A > 0; GIPO keeps a damped one.
    logp_new = t(1.0).requires_grad_()
    gipo_loss(logp_new, t(0.0), t(0.0), t(1.0), sigma=0.5)[0].backward()
    # g*r = exp(1 - 1/(2*0.25)) = exp(-1);  grad = -exp(-1)
    assert close(logp_new.grad, t(-math.exp(-1.0)))
    logp_new = t(80.0, -80.0, 0.0).float().requires_grad_()
    loss, _ = gipo_loss(logp_new, torch.zeros(3), torch.zeros(3), torch.tensor([1.0, -1.0, 0.0]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp_new.grad).all()


@pytest.mark.parametrize("fn", [decoupled_ppo_loss, gipo_loss])
def test_policy_losses_batch_equals_mean_of_rows(fn):
    torch.manual_seed(4)
    b, n = 3, 5
    prox = torch.randn(b, n, dtype=torch.float64)
    new = prox + 0.4 * torch.randn(b, n).double()
    behavior = prox + 0.4 * torch.randn(b, n).double()
    adv = torch.randn(b, n, dtype=torch.float64)
    loss, stats = fn(new, prox, behavior, adv)
    rows = [fn(new[i], prox[i], behavior[i], adv[i]) for i in range(b)]
    assert close(loss, torch.stack([r[0] for r in rows]).mean())
    assert stats["is/ratio_max"] == pytest.approx(max(r[1]["is/ratio_max"] for r in rows))
    assert 0.0 < stats["is/ess"] <= 1.0


def test_policy_losses_validate_arguments():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="one shape"):
        decoupled_ppo_loss(x, x, x, torch.zeros(3, 1))
    with pytest.raises(ValueError, match="clip_eps"):
        decoupled_ppo_loss(x, x, x, x, clip_eps=0.0)
    with pytest.raises(ValueError, match="sigma"):
        gipo_loss(x, x, x, x, sigma=0.0)
    with pytest.raises(ValueError, match="bool"):
        gipo_loss(x, x, x, x, mask=torch.ones(3))


# --- value loss and entropy --------------------------------------------------------------------------------------

def test_value_loss_plain_and_clipped():
    values, returns, old = t(1.0, 2.0).requires_grad_(), t(1.5, 0.0), t(0.8, 2.5)
    # plain: 0.5 * mean(0.25, 4.0) = 1.0625
    assert close(value_loss(values, returns), 1.0625)
    # clip 0.2: v_clip = [0.8 + 0.2, 2.5 - 0.2] = [1.0, 2.3] -> errors [0.25, 5.29];
    # max with unclipped [0.25, 4.0] -> [0.25, 5.29];  0.5 * mean = 0.5 * 2.77 = 1.385
    loss = value_loss(values, returns, old_values=old, clip=0.2)
    assert close(loss, 1.385)
    # Sample 1 takes the clipped branch, whose value does not depend on `values` (clamp saturated): no gradient;
    # sample 0: d/dv 0.5*(v - 1.5)^2 / 2 = (1.0 - 1.5)/2 = -0.25
    loss.backward()
    assert close(values.grad, t(-0.25, 0.0))
    with pytest.raises(ValueError, match="old_values"):
        value_loss(values, returns, clip=0.2)
    # mask: only sample 0 counts -> 0.5 * 0.25
    assert close(value_loss(values, returns, mask=torch.tensor([T, F])), 0.125)


def test_entropy_bonus():
    assert close(entropy_bonus(t(1.0, 2.0, 6.0)), 3.0)
    assert close(entropy_bonus(t(1.0, math.nan, 6.0), mask=torch.tensor([T, F, T])), 3.5)


def test_gaussian_kl_hand_numbers():
    from acce.algo import gaussian_kl
    # per dim: log(2/1) + (1 + (1 - 0)^2) / (2 * 4) - 1/2 = 0.693147 + 0.25 - 0.5 = 0.443147; two dims -> 0.886294
    mean_p, mean_q = torch.ones(3, 2, 2), torch.zeros(3, 2, 2)
    log_std_p, log_std_q = torch.zeros(2, 2), torch.full((2, 2), math.log(2.0))
    assert gaussian_kl(mean_p, log_std_p, mean_q, log_std_q).item() == pytest.approx(0.886294, abs=1e-5)
    assert gaussian_kl(mean_p, log_std_p, mean_p, log_std_p).item() == pytest.approx(0.0, abs=1e-7)
