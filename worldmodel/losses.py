"""The world model's training loss on a batch of sequences (one function, shared by pretraining and online training).

A sequence is L transitions of one real episode: images/state (B, L+1, ...), action (B, L, A), reward, terminated,
success and mask (B, L), and the episode's instruction (list of B str). Every frame is encoded; the latent is then
rolled out open loop from the first frame with the real actions, following the heads' mean (what ImaginedEnv does).
Losses, weighted by rollout_discount**t:
  recon    decode(encode(o_0)) vs o_0                      (image MSE summed over pixels / 1000, state MSE)
  predict  decode(ẑ_{t+1}, context=o_0) vs o_{t+1}          (so open-loop predictions stay decodable)
  latent   each head's f_k(ẑ_t, a_t) vs sg(encode(o_{t+1})) (TD-MPC2's consistency; sg = no gradient)
  reward   reward(z, a_t) vs r_t on both the encoded and the rolled-out latent
  done     (terminated, success) logits of encode(o_{t+1}) and of ẑ_{t+1} vs the labels (BCE, positives weighted by
           wm.done_pos_weight: a success is one frame of an episode, so an unweighted head learns to say "no")
  aux      (models with an aux head only) aux(z) vs the frames' privileged labels batch["aux"] (B, L+1, P), MSE on
           standardized labels: aux_recon on the encoded first frame, aux_pred on the rolled-out latents (what
           ImaginedEnv emits as obs["aux"] for the privileged critic)
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch.nn import functional as F

from worldmodel.model import WorldModel

PIXEL_SCALE = 1e-3
"""image losses are summed over pixels and scaled by this, so a 64x64 image weighs ~12x its mean squared error"""


def to_tensors(batch: Mapping[str, Any], device: torch.device | str = "cpu") -> dict[str, Any]:
    """Arrays to tensors; the instruction list stays a list of str."""
    return {k: v if k == "instruction" else torch.as_tensor(v, device=device) for k, v in batch.items()}


def _pixels(images: torch.Tensor) -> torch.Tensor:
    """(..., H, W, 3C) uint8 -> (..., 3C, H, W) float in [0, 1]"""
    return images.movedim(-1, -3).contiguous().float() / 255.0


def _wmean(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sum() / w.sum().clamp_min(1e-6)


def done_bce(logits: torch.Tensor, labels: torch.Tensor, pos_weight: float) -> torch.Tensor:
    """Elementwise binary cross-entropy of (terminated, success) logits (..., 2) against 0/1 labels, a positive
    label's term multiplied by pos_weight: -(pos_weight * y * log σ(x) + (1 - y) * log(1 - σ(x)))."""
    return F.binary_cross_entropy_with_logits(logits, labels, reduction="none",
                                              pos_weight=logits.new_tensor(pos_weight))


def sequence_loss(model: WorldModel, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss and its parts (floats) for one batch of sequences; see the module docstring."""
    cfg = model.cfg
    images, state = batch["images"], batch["state"].float()
    B, L1 = state.shape[:2]
    L = L1 - 1
    mask = batch["mask"].float()  # (B, L): transition t exists
    disc = cfg.rollout_discount ** torch.arange(L, dtype=torch.float32, device=mask.device)
    w = mask * disc  # (B, L)

    pix = _pixels(images)  # (B, L+1, 3C, H, W)
    state_n = (state - model.state_mean) / model.state_std
    goal = model.embed_instruction(batch["instruction"])  # (B, G): one instruction per sequence (episode)
    z = model.encode_tensors(pix.flatten(0, 1), state_n.flatten(0, 1),
                             goal.unsqueeze(1).expand(B, L1, goal.shape[-1]).flatten(0, 1)).view(B, L1, -1)
    phys = cfg.latent_dim  # consistency is on the physical part; the instruction part is carried, not predicted
    target = z.detach()
    action, reward_n = batch["action"].float(), (batch["reward"].float() - model.reward_mean) / model.reward_std
    labels = torch.stack([batch["terminated"], batch["success"]], -1).float()  # (B, L, 2)
    zt, preds, latent, rew, disagree = z[:, 0], [z[:, 0]], [], [], []
    for t in range(L):
        p = model.next(zt, action[:, t])
        latent.append((p.heads[..., :phys] - target[:, t + 1, :phys]).pow(2).mean((0, 2)))
        rew.append(0.5 * ((model.reward(zt, action[:, t], normalized=True) - reward_n[:, t]).pow(2)
                          + (model.reward(z[:, t], action[:, t], normalized=True) - reward_n[:, t]).pow(2)))
        disagree.append(p.disagreement.detach())
        zt = p.z
        preds.append(zt)
    # Frame 0 is decoded from its encoding with no context (so the latent must hold the whole image); frames 1..L are
    # decoded from the rolled-out latents composited onto frame 0, as ImaginedEnv decodes onto a branch's start.
    zp = torch.stack(preds, 1)  # (B, L+1, Lat)
    rec_pix, rec_state = model.decode_tensors(zp[:, 0])
    ctx = pix[:, 0].unsqueeze(1).expand(B, L, *pix.shape[2:]).flatten(0, 1)
    pred_pix, pred_state = model.decode_tensors(zp[:, 1:].flatten(0, 1), ctx)
    out_pix = torch.cat([rec_pix.unsqueeze(1), pred_pix.view(B, L, *pix.shape[2:])], 1)
    out_state = torch.cat([rec_state.unsqueeze(1), pred_state.view(B, L, -1)], 1)
    img_err = (out_pix - pix).pow(2).sum((2, 3, 4)) * PIXEL_SCALE  # (B, L+1)
    state_err = (out_state - state_n).pow(2).mean(-1)
    img_rec, state_rec = img_err[:, 0].mean(), state_err[:, 0].mean()
    img_pred, state_pred = _wmean(img_err[:, 1:], w), _wmean(state_err[:, 1:], w)
    aux_parts = aux_loss(model, zp, batch, w) if model.aux_dim else {}
    zp = zp[:, 1:]
    latent_loss = _wmean(torch.stack(latent, 1), w)
    reward_loss = _wmean(torch.stack(rew, 1), w)
    pw = cfg.done_pos_weight
    done_loss = _wmean(0.5 * (done_bce(model.done_logits(zp), labels, pw)
                              + done_bce(model.done_logits(z[:, 1:]), labels, pw)).sum(-1), w)
    total = (cfg.image_weight * (img_rec + img_pred) + cfg.state_weight * (state_rec + state_pred)
             + cfg.latent_weight * latent_loss + cfg.reward_weight * reward_loss + cfg.done_weight * done_loss
             + cfg.aux_weight * sum(aux_parts.values()))  # 0 without an aux head
    parts: dict[str, Any] = {"total": total, "image_recon": img_rec, "image_pred": img_pred, "state_recon": state_rec,
                             "state_pred": state_pred, "latent": latent_loss, "reward": reward_loss, "done": done_loss,
                             "disagreement": _wmean(torch.stack(disagree, 1), mask), **aux_parts}
    return total, {k: float(v.detach()) for k, v in parts.items()}


def aux_loss(model: WorldModel, zp: torch.Tensor, batch: Mapping[str, Any], w: torch.Tensor) -> dict[str, torch.Tensor]:
    """{"aux_recon", "aux_pred"} for latents zp (B, L+1, Z) (frame 0 encoded, then rolled out) against batch["aux"]
    (B, L+1, P): squared error of the standardized labels, mean over P; frame 0 averaged over B, frames 1..L
    weighted by w (B, L) = mask x discount, like the state terms."""
    if "aux" not in batch:
        raise ValueError(f"this world model has an aux head (aux_dim={model.aux_dim}) but the batch has no 'aux' "
                         "labels: train it on episodes recorded with obs['aux'] (a store with frames/aux)")
    target = (batch["aux"].float() - model.aux_mean) / model.aux_std
    err = (model.aux(zp, normalized=True) - target).pow(2).mean(-1)  # (B, L+1)
    return {"aux_recon": err[:, 0].mean(), "aux_pred": _wmean(err[:, 1:], w)}
