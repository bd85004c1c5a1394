"""Learner: chunk-level actor-critic on segments, off-policy corrected against the behavior policy.

One `update(segments)` = measure staleness at consumption (queue time counts) and exclude (and count) segments
beyond `max_staleness`; compute proximal log-probs and values with the current weights; advantages by GAE or
V-trace over semi-Markov decisions (rewards and discounts of the executed spans); then `epochs x minibatches`
optimizer steps of decoupled PPO or GIPO + value loss − entropy bonus (+ an optional KL anchor to the policy RL
started from); after an early stop at learner.kl_stop, learner.critic_tail keeps fitting the critic alone. `version`
counts the optimizer steps that change the actor.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from acce.algo.losses import (aux_regression_loss, decoupled_ppo_loss, entropy_bonus, explained_variance,
                              gaussian_kl, gipo_loss, value_loss)
from acce.algo.returns import gae, vtrace
from acce.augment import augment_batch
from acce.policy.frozen import RL_SCOPE_PREFIXES, features_with_shipped, frozen_stamp
from acce.runtime.batch import collate, select_rows
from acce.task_names import task_id
from acce.types import AUX_KEY, TASK_ID_KEY, Segment

__all__ = ["Learner", "collate", "make_learner"]  # collate re-exported: callers build batches the way updates do


class Learner:
    def __init__(self, policy, cfg, *, seed: int = 0):
        """cfg: acce.config.LearnerConfig."""
        self.policy, self.cfg = policy, cfg
        self.actor_lr = float(cfg.lr)
        """the actor's current learning rate (adapted when learner.target_kl > 0)"""
        self.rl_started = False
        """set by the first RL update: from then on learner.train_scope decides what trains"""
        if cfg.critic_tail and policy.config.critic != "privileged" and cfg.train_scope == "all" \
                and not policy.config.value_stop_gradient:
            raise ValueError("learner.critic_tail steps the critic alone, but this critic shares the encoder with the "
                             "actor: use policy.critic=privileged, policy.value_stop_gradient=true or "
                             "learner.train_scope=residual, or set critic_tail=false")
        self.reset_optimizer()
        self.version = 0
        self.rng = np.random.default_rng(seed)
        self.excluded_segments = 0
        self.ret_stats = [0, 0.0, 0.0]  # count, mean, sum of squared deviations of value targets (normalize_values)
        self.updates = 0
        self.consumed_segments = 0
        self.consumed_env_steps = 0
        """control steps of the simulator (real) segments used in updates: what benches count, not what actors made"""
        self.consumed_imagined_steps = 0
        self.ref_policy = None
        """frozen copy of the policy at the first RL update (learner.ref_kl_coef > 0)"""

    def anchor_reference(self) -> None:
        """Freeze the current policy as the KL reference (once; a resumed learner keeps its checkpointed one)."""
        if self.ref_policy is None:
            self.ref_policy = self._frozen(self.policy.policy_state())

    def _frozen(self, policy_state: dict[str, Any]):
        """A no-grad eval-mode policy rebuilt from a policy_state (not deep-copied: the copy needs no language
        encoder, batches carry embeddings)."""
        from acce.device import place  # same device and mixed precision as the policy it anchors
        ref = place(type(self.policy).from_state(policy_state), self.policy.device, self.policy.amp).eval()
        ref.requires_grad_(False)
        return ref

    RL_SCOPE_PREFIXES = RL_SCOPE_PREFIXES
    """what learner.train_scope=residual trains (acce.policy.frozen: the server's frozen stamp skips the same)"""

    def start_rl(self) -> None:
        """Before the first RL update (and on resuming one): apply learner.train_scope. 'residual' freezes every
        other weight (and publishes only what trains); the residual head joins the optimizer only now, so cloning
        never trains it."""
        if self.rl_started:
            return
        if self.cfg.aux_coef > 0 and self.policy.aux_norm is None:
            raise ValueError("learner.aux_coef > 0 needs a warm start with an aux head and its cloning statistics "
                             "(cloned with bc.aux_loss_coef > 0 by this acce): clone it again or set aux_coef=0")
        self.rl_started = True
        if self.cfg.train_scope == "residual":
            for name, p in self.policy.named_parameters():
                if not name.startswith(self.RL_SCOPE_PREFIXES):
                    p.requires_grad_(False)
        self.reset_optimizer()

    def reset_optimizer(self, lr: float | None = None) -> None:
        """Fresh Adam moments at `lr` (default learner.lr): the BC warm start uses its own rate, and RL must not
        inherit supervised momentum."""
        lr = self.actor_lr if lr is None else lr
        params = [p for n, p in self.policy.named_parameters() if p.requires_grad
                  and (self.rl_started or not n.startswith("residual."))]
        critic_lr = self.cfg.critic_lr
        if critic_lr > 0 and self.policy.config.value_stop_gradient:
            # the stop-gradient critic head learns at its own rate: its targets (returns of -20 .. +10) are far from
            # its init, and at the actor's fine-tuning rate it did not move in 180 updates (value loss stayed ~15)
            critic = {id(p) for p in self.policy.value_head.parameters()}
            groups = [{"params": [p for p in params if id(p) not in critic], "lr": lr},
                      {"params": [p for p in params if id(p) in critic], "lr": critic_lr}]
            self.optimizer = torch.optim.Adam(groups, eps=1e-5)
        else:
            self.optimizer = torch.optim.Adam(params, lr=lr, eps=1e-5)

    @torch.no_grad()
    def set_log_std(self, value: float | None, per_dim: tuple[float, ...] = ()) -> None:
        """learner.rl_log_std (one value) or rl_log_std_per_dim (one per action dimension, which wins): the
        exploration noise RL starts with (None and (): unchanged)."""
        if per_dim:
            if len(per_dim) != self.policy.log_std.shape[-1]:
                raise ValueError(f"learner.rl_log_std_per_dim has {len(per_dim)} values; the policy acts in "
                                 f"{self.policy.log_std.shape[-1]} dimensions")
            self.policy.log_std.copy_(torch.tensor(per_dim, dtype=self.policy.log_std.dtype).expand_as(
                self.policy.log_std))
        elif value is not None:
            self.policy.log_std.fill_(float(value))

    # --- weights ------------------------------------------------------------------------------------------------
    def trainable_state(self) -> dict[str, np.ndarray]:
        return {k: v.cpu().numpy() for k, v in self.policy.trainable_state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.policy_state(), "optimizer": self.optimizer.state_dict(),
                "version": self.version, "rng": self.rng.bit_generator.state,
                "torch_rng": torch.get_rng_state(), "excluded_segments": self.excluded_segments,
                "actor_lr": self.actor_lr, "rl_started": self.rl_started,
                "updates": self.updates, "ret_stats": list(self.ret_stats),
                "consumed_segments": self.consumed_segments, "consumed_env_steps": self.consumed_env_steps,
                "consumed_imagined_steps": self.consumed_imagined_steps,
                "ref_policy": None if self.ref_policy is None else self.ref_policy.policy_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"]["state_dict"])
        if state["policy"].get("aux_norm") is not None:
            self.policy.set_aux_norm(*state["policy"]["aux_norm"])
        if state.get("rl_started"):  # the saved optimizer holds the RL parameter set
            self.start_rl()
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        self.ret_stats = list(state.get("ret_stats", [0, 0.0, 0.0]))
        self.actor_lr = float(state.get("actor_lr", self.cfg.lr))
        for k in ("excluded_segments", "consumed_segments", "consumed_env_steps", "consumed_imagined_steps", "updates"):
            setattr(self, k, int(state.get(k, 0)))
        ref = state.get("ref_policy")
        self.ref_policy = None if ref is None else self._frozen(ref)

    def _clip_gradients(self) -> torch.Tensor:
        """Clip to max_grad_norm; with a stop-gradient critic, actor and critic separately (their parameters are
        disjoint, and one joint norm would let the critic's large early gradients shrink every actor step).
        Returns the actor's (or the joint) pre-clip norm."""
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if not self.policy.config.value_stop_gradient:
            return torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)
        critic = {id(p) for p in self.policy.value_head.parameters()}
        torch.nn.utils.clip_grad_norm_([p for p in params if id(p) in critic], self.cfg.max_grad_norm)
        return torch.nn.utils.clip_grad_norm_([p for p in params if id(p) not in critic], self.cfg.max_grad_norm)

    def _step(self, loss: torch.Tensor) -> torch.Tensor:
        """One optimizer step on `loss` (parameters it does not reach keep no gradient, so Adam leaves them alone);
        returns the pre-clip gradient norm."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = self._clip_gradients()
        self.optimizer.step()
        return grad_norm

    def _adapt_lr(self, approx_kl: float) -> None:
        """learner.target_kl: KL this update has moved so far above 2x target -> lr / 1.5, below half -> lr * 1.5
        (KL 0 is the update's first minibatch, where nothing moved yet: no signal)."""
        cfg = self.cfg
        if approx_kl > 2.0 * cfg.target_kl:
            self.actor_lr = max(cfg.lr_min, self.actor_lr / 1.5)
        elif 0.0 < approx_kl < 0.5 * cfg.target_kl:
            self.actor_lr = min(cfg.lr_max, self.actor_lr * 1.5)
        self.optimizer.param_groups[0]["lr"] = self.actor_lr  # group 0 is the actor's (or the only one)

    # --- update -------------------------------------------------------------------------------------------------
    def count_consumed(self, segments: Sequence[Segment]) -> dict[str, float]:
        """Count what an update used (after admit: excluded segments are not counted) and return the totals as
        metrics; benches read them instead of the env steps actors produced, part of which never reach a learner."""
        self.consumed_segments += len(segments)
        for s in segments:
            steps = int(np.asarray(s.exec_len).sum())
            if s.source == "imagined":
                self.consumed_imagined_steps += steps
            else:
                self.consumed_env_steps += steps
        return {"learner/consumed_segments": float(self.consumed_segments),
                "learner/consumed_env_steps": float(self.consumed_env_steps),
                "learner/consumed_imagined_steps": float(self.consumed_imagined_steps)}

    def admit(self, segments: Sequence[Segment]) -> tuple[list[Segment], dict[str, float]]:
        """Staleness at consumption; segments beyond max_staleness are excluded and counted, never silently."""
        stale = [self.version - int(s.behavior_version.min()) for s in segments]
        keep = [s for s, st in zip(segments, stale) if self.cfg.max_staleness < 0 or st <= self.cfg.max_staleness]
        self.excluded_segments += len(segments) - len(keep)
        per_decision = np.concatenate([self.version - s.behavior_version for s in segments])
        now = time.time()
        return keep, {"staleness/mean": float(per_decision.mean()), "staleness/max": float(per_decision.max()),
                      "staleness/excluded_segments": float(self.excluded_segments),
                      "queue/wait_s_mean": float(np.mean([now - s.created_s for s in segments]))}

    @torch.no_grad()
    def _targets(self, data: dict[str, Any]) -> dict[str, torch.Tensor]:
        cfg, b, t, dev = self.cfg, data["B"], data["T"], self.policy.device
        self.policy.eval()
        mask = torch.as_tensor(data["mask"], device=dev)
        inputs = self.policy.with_lang(data["inputs"])
        # (cached for every minibatch when only the heads train; rows with shipped frozen features skip the trunk)
        feats = features_with_shipped(self.policy, inputs, *data["shipped"])
        mean, log_std, values = self.policy.heads(feats)
        logp_prox = self.policy.log_prob(mean, log_std, torch.as_tensor(data["chunk"], device=dev), mask)
        cached = {}
        if self.cfg.train_scope == "residual":
            cached["feats"] = feats
            if self.cfg.ref_kl_coef > 0:
                cached["ref_mean"], cached["ref_log_std"], _ = self.ref_policy(inputs)
            if self.cfg.anchor_tasks:  # the frozen cloned head's mean: the warm start's chunk without the residual
                cached["base_mean"] = self.policy.mean_head(feats["h_action"]).view(mean.shape)
        boot = self.policy.with_lang(data["boot"])  # (the privileged critic needs no vision or trunk for these rows)
        boot_values = self.policy.value(self.policy.features_from(boot, {}) if self.policy.config.critic == "privileged"
                                        else self.policy.features(boot))
        values = values.view(b, t)
        if not cfg.recompute_values:
            values = torch.as_tensor(data["behavior_value"], device=dev)
        mu, sigma = self.value_stats()  # the critic predicts standardized returns (identity when off)
        values, boot_values = values * sigma + mu, boot_values * sigma + mu
        following = torch.cat([values[:, 1:], values[:, -1:]], 1)
        ni = torch.as_tensor(data["next_index"], device=dev)
        next_values = torch.where(ni >= 0, boot_values[ni.clamp(min=0)], following)
        rewards = torch.as_tensor(data["reward"], device=dev)
        discounts = torch.as_tensor(data["discount"], device=dev)
        ends = torch.as_tensor(data["episode_end"], device=dev)
        behavior_logp = torch.as_tensor(data["behavior_logp"], device=dev)
        if cfg.advantage == "gae":
            adv, returns = gae(rewards, discounts, values, next_values, ends, cfg.lam)
        else:
            vs, _ = vtrace(rewards, discounts, values, next_values, ends, logp_prox.view(b, t) - behavior_logp,
                           rho_bar=cfg.vtrace_rho_bar, c_bar=cfg.vtrace_c_bar, lam=cfg.lam)
            vs_following = torch.cat([vs[:, 1:], next_values[:, -1:]], 1)
            vs_next = torch.where(ni >= 0, next_values, vs_following)
            adv, returns = rewards + discounts * vs_next - values, vs  # no rho here: the loss applies its own IS
        if cfg.normalize_values:
            self._update_value_stats(returns.reshape(-1))
        mu, sigma = self.value_stats()
        return {**cached, "adv": adv.reshape(-1), "returns": returns.reshape(-1), "logp_prox": logp_prox,
                "behavior_logp": behavior_logp.reshape(-1), "old_values": values.reshape(-1),
                "returns_std": (returns.reshape(-1) - mu) / sigma, "old_values_std": (values.reshape(-1) - mu) / sigma}

    # --- value normalization ------------------------------------------------------------------------------------
    def value_stats(self) -> tuple[float, float]:
        """(mean, std) of every value target seen so far (Welford); (0, 1) when off or before two targets."""
        if not self.cfg.normalize_values or self.ret_stats[0] < 2:
            return 0.0, 1.0
        n, mean, m2 = self.ret_stats
        return float(mean), float(max(np.sqrt(m2 / n), 1e-3))

    def _update_value_stats(self, returns: torch.Tensor) -> None:
        x = returns.double().cpu().numpy()
        n0, mean0, m20 = self.ret_stats
        n1, mean1, m21 = len(x), float(x.mean()), float(((x - x.mean()) ** 2).sum())
        n = n0 + n1
        delta = mean1 - mean0
        self.ret_stats = [n, mean0 + delta * n1 / n, m20 + m21 + delta * delta * n0 * n1 / n]

    def update(self, segments: Sequence[Segment]) -> dict[str, float]:
        t_start = time.perf_counter()
        segments, metrics = self.admit(segments)
        if not segments:
            return metrics
        cfg = self.cfg
        self.start_rl()
        if cfg.ref_kl_coef > 0:
            self.anchor_reference()
        # residual scope: reuse the features actors shipped from these very frozen weights (acce.policy.frozen)
        data = collate(segments, frozen_stamp(self.policy) if cfg.train_scope == "residual" else None)
        tg = self._targets(data)
        adv = tg["adv"]
        if cfg.normalize_advantages and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        n = adv.numel()
        dev = self.policy.device
        chunk, mask = torch.as_tensor(data["chunk"], device=dev), torch.as_tensor(data["mask"], device=dev)
        pg_mask = mask.any(1)
        anchored = (torch.as_tensor(np.isin(data["inputs"][TASK_ID_KEY], [task_id(t) for t in cfg.anchor_tasks]),
                                    device=dev) if cfg.anchor_tasks else None)  # learner.anchor_tasks' decisions
        self.policy.train()
        sums: dict[str, float] = {}
        steps = tail_steps = 0
        stopped = False
        for _ in range(cfg.epochs):
            if stopped and not cfg.critic_tail:
                break
            perm = self.rng.permutation(n)
            for idx in np.array_split(perm, cfg.minibatches):
                it = torch.as_tensor(idx, device=dev)
                if "feats" in tg:  # train_scope=residual: trunk features from the no-grad pass, heads only
                    (mean, log_std, values), aux = self.policy.heads({k: None if v is None else v[it]
                                                                      for k, v in tg["feats"].items()}), ()
                else:
                    batch = self.policy.with_lang(select_rows(data["inputs"], idx))
                    mean, log_std, values, *aux = self.policy(batch, return_aux=cfg.aux_coef > 0)
                if not stopped:  # (after a stop, learner.critic_tail needs only the values)
                    logp = self.policy.log_prob(mean, log_std, chunk[it], mask[it])
                    entropy = self.policy.entropy(log_std, mask[it])
                    args = (logp, tg["logp_prox"][it], tg["behavior_logp"][it], adv[it])
                    if cfg.algorithm == "ppo":
                        pl, stats = decoupled_ppo_loss(*args, clip_eps=cfg.clip_eps, is_cap=cfg.is_cap,
                                                       mask=pg_mask[it])
                    else:
                        pl, stats = gipo_loss(*args, sigma=cfg.gipo_sigma, is_cap=cfg.is_cap, mask=pg_mask[it])
                    if cfg.kl_stop > 0 and steps > 0 and stats["is/approx_kl"] > 1.5 * cfg.kl_stop:
                        stopped = True  # this update has moved the policy far enough (learner.kl_stop)
                        if not cfg.critic_tail:
                            break
                vl = value_loss(values, tg["returns_std"][it], tg["old_values_std"][it], clip=cfg.value_clip)
                if stopped:  # learner.critic_tail: only the critic, which shares no weight with the actor, steps on
                    self._step(cfg.vf_coef * vl)
                    tail_steps += 1
                    continue
                ent = entropy_bonus(entropy, mask=pg_mask[it])
                pg_weight = 0.0 if self.updates < cfg.value_warmup_updates else 1.0
                if cfg.target_kl > 0 and pg_weight > 0:
                    self._adapt_lr(stats["is/approx_kl"])
                loss = pg_weight * (pl - cfg.ent_coef * ent) + cfg.vf_coef * vl
                if aux:  # learner.aux_coef: the encoder keeps locating the object and goal while RL trains it
                    al = aux_regression_loss(aux[0], batch.get(AUX_KEY), *self.policy.aux_norm)
                    loss, stats = loss + cfg.aux_coef * al, {**stats, "loss/aux": al.item()}
                if cfg.ref_kl_coef > 0:  # (anchored above)
                    if "ref_mean" in tg:
                        ref_mean, ref_log_std = tg["ref_mean"][it], tg["ref_log_std"]
                    else:
                        with torch.no_grad():
                            ref_mean, ref_log_std, _ = self.ref_policy(batch)
                    kl = gaussian_kl(mean, log_std, ref_mean, ref_log_std)
                    loss = loss + cfg.ref_kl_coef * kl
                    stats = {**stats, "loss/ref_kl": kl.item()}
                if cfg.anchor_tasks:  # (0 in a minibatch without an anchored decision)
                    rows, sig = anchored[it], log_std.detach()
                    ak = gaussian_kl(mean[rows], sig, tg["base_mean"][it][rows], sig) if rows.any() else mean.sum() * 0
                    loss, stats = loss + cfg.anchor_coef * ak, {**stats, "loss/anchor_kl": ak.item(),
                                                                "learner/anchored_frac": rows.float().mean().item()}
                grad_norm = self._step(loss)
                self.version += 1
                steps += 1
                for k, v in {**stats, "loss/policy": pl.item(), "loss/value": vl.item(), "loss/entropy": ent.item(),
                             "loss/grad_norm": grad_norm.item()}.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
        self.updates += 1
        metrics.update(self.count_consumed(segments))
        metrics.update({k: v / steps for k, v in sums.items()})
        metrics.update({"learner/version": float(self.version), "learner/update_s": time.perf_counter() - t_start,
                        "learner/opt_steps": float(steps), "learner/critic_tail_steps": float(tail_steps),
                        "learner/shipped_features_frac":
                        float(data["shipped"][1].mean()),
                        "learner/decisions": float(n), "learner/adv_mean": float(tg["adv"].mean()),
                        "learner/return_mean": float(tg["returns"].mean()),
                        "learner/value_scale": self.value_stats()[1],
                        "learner/log_std_mean": self.policy.log_std.mean().item(), "learner/lr": self.actor_lr,
                        "learner/explained_var": explained_variance(tg["old_values"], tg["returns"]),
                        "delay/steps_mean": float(data["delay_steps"].mean()),
                        "delay/steps_max": float(data["delay_steps"].max()),
                        "delay/exec_len_mean": float(data["exec_len"].mean()),
                        "delay/masked_step_frac": 1.0 - float(data["mask"].sum()) / max(float(data["exec_len"].sum()),
                                                                                      1.0)})
        return metrics

    # --- behavior cloning warm start ----------------------------------------------------------------------------
    def bc_step(self, inputs: dict[str, Any], target: np.ndarray, mask: np.ndarray, augment_px: int = 0,
                aux_coef: float = 0.0) -> tuple[float, float]:
        """One supervised step: chunk means regress the demonstrated actions (positions where mask); with aux_coef
        > 0, the aux head also regresses inputs["aux"] (standardized privileged targets), weighted by aux_coef.
        Returns (action loss, aux loss; nan without aux)."""
        self.policy.train()
        inputs = augment_batch(inputs, augment_px, self.rng)
        use_aux = aux_coef > 0.0
        if use_aux and AUX_KEY not in inputs:
            raise ValueError("bc aux_coef > 0 but the batch has no 'aux' targets; record the demos with aux labels")
        out = self.policy(self.policy.with_lang(inputs), return_aux=use_aux)
        mean = out[0]
        m = torch.as_tensor(mask, device=mean.device)[..., None].float()
        target = torch.as_tensor(target, device=mean.device)
        loss = (((mean - target) ** 2) * m).sum() / (m.sum() * mean.shape[-1]).clamp(min=1.0)
        aux_loss = ((out[3] - torch.as_tensor(inputs[AUX_KEY], device=mean.device)) ** 2).mean() if use_aux else None
        self.optimizer.zero_grad(set_to_none=True)
        (loss if aux_loss is None else loss + aux_coef * aux_loss).backward()
        self._clip_gradients()
        self.optimizer.step()
        return float(loss.detach()), float("nan") if aux_loss is None else float(aux_loss.detach())


def make_learner(policy, cfg, *, seed: int = 0) -> Learner:
    """The learner learner.algorithm asks for: on-policy PPO/GIPO (Learner) or off-policy td3 (OffPolicyLearner)."""
    if cfg.algorithm == "td3":
        from acce.runtime.offpolicy import OffPolicyLearner
        return OffPolicyLearner(policy, cfg, seed=seed)
    return Learner(policy, cfg, seed=seed)
