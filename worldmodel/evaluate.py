"""`acce wm-eval`: open-loop prediction quality of a world-model checkpoint on held-out real episodes.

From every start frame t0 (stride `start_stride`) of every held-out episode the model encodes o_{t0} and rolls out
with the recorded actions; the prediction at horizon h is compared with o_{t0+h} (only where the episode is that
long; n per horizon is reported). Metrics per horizon (1, 4, 16): image MSE on [0, 1] pixels and PSNR, state RMSE
and mean L2 norm of the state error (raw units), reward MAE, the disagreement, and (models with an aux head, on
episodes with aux labels) the aux head's RMSE in the labels' units (m). Frames are decoded onto the start
frame, as ImaginedEnv does. Success/terminated heads: precision and recall at logit > the model's threshold (0 unless
calibrated) on one-step predicted latents (what ImaginedEnv uses), and the threshold-free AUROC and average precision
of their logits. Held-out episodes are the checkpoint's validation split when `data` is the dataset it was trained on, else every episode of `data` (a
separate test dataset).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from worldmodel.calibration import counts_at_thresholds
from worldmodel.data import EpisodeArrays, load_episodes, split_cameras
from worldmodel.model import WorldModel

HORIZONS = (1, 4, 16)


@torch.no_grad()
def open_loop(model: WorldModel, images: np.ndarray, state: np.ndarray, instructions: Sequence[str],
              actions: np.ndarray) -> dict[str, np.ndarray]:
    """Roll out from frame 0 with the given actions: images (B, H, W, 3C), state (B, S), B instructions, actions
    (B, T, A) -> predicted images (B, T, H, W, 3C) uint8, state (B, T, S), reward (B, T), logits (B, T, 2),
    disagreement (B, T), and aux (B, T, P) when the model has an aux head."""
    obs = {**split_cameras(images, model.cameras), "state": state, "instruction": list(instructions)}
    z = model.encode(obs)
    out: dict[str, list] = {"images": [], "state": [], "reward": [], "logits": [], "disagreement": []}
    for t in range(actions.shape[1]):
        a = torch.as_tensor(actions[:, t], dtype=torch.float32)
        out["reward"].append(model.reward(z, a).numpy())
        pred = model.next(z, a)
        z = pred.z
        out["logits"].append(model.done_logits(z).numpy())
        out["disagreement"].append(pred.disagreement.numpy())
        decoded = model.decode(z, obs)  # composited onto the start frame, as in ImaginedEnv
        out["images"].append(np.concatenate([decoded[k] for k in model.image_keys], -1))
        out["state"].append(decoded["state"])
        if "aux" in decoded:
            out.setdefault("aux", []).append(decoded["aux"])
    return {k: np.stack(v, 1) for k, v in out.items()}


def frame_strip(real: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """(T, H, W, 3) real and predicted frames -> (2H + 2, T * (W + 2), 3): real on top, imagined below."""
    t, h, w, _ = real.shape
    out = np.full((2 * h + 2, t * (w + 2), 3), 255, np.uint8)
    for i in range(t):
        out[:h, i * (w + 2):i * (w + 2) + w] = real[i]
        out[h + 2:, i * (w + 2):i * (w + 2) + w] = pred[i]
    return out


def head_scores(logits: np.ndarray, label: np.ndarray, threshold: float = 0.0) -> dict[str, float | int | None]:
    """A done head's logits against its labels: precision and recall at logit > threshold (what ImaginedEnv acts
    on: the model's `done_threshold`, 0 unless calibrated) and,
    threshold-free, AUROC and average precision, which tell a head that ranks well but is miscalibrated (its recall
    moves with the threshold) from one that cannot tell the steps apart."""
    logits, label = np.asarray(logits, np.float64), np.asarray(label, bool)
    pred = logits > threshold
    tp, fp, fn = int((pred & label).sum()), int((pred & ~label).sum()), int((~pred & label).sum())
    npos, nneg = int(label.sum()), int((~label).sum())
    auroc = ap = None
    if npos and nneg:
        # AUROC = P(a positive outscores a negative), ties counting half (Mann-Whitney U over average ranks)
        _, inverse, counts = np.unique(logits, return_inverse=True, return_counts=True)
        ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # 1-based, tied values share their mean rank
        auroc = float((ranks[label].sum() - npos * (npos + 1) / 2) / (npos * nneg))
        # average precision: sum over distinct thresholds (best first) of recall gained x precision there
        _, tps, fps = counts_at_thresholds(logits, label)
        ap = float(np.sum(np.diff(np.r_[0, tps]) / npos * tps / (tps + fps)))
    return {"precision": tp / (tp + fp) if tp + fp else None, "recall": tp / (tp + fn) if tp + fn else None,
            "auroc": auroc, "average_precision": ap, "positives": npos, "n": int(label.size),
            "threshold": float(threshold)}


def _held_out(episodes: list[EpisodeArrays], model: WorldModel, data_path: str) -> tuple[list[EpisodeArrays], str]:
    val_ids = set(model.data_info.get("val_episode_ids") or [])
    mine = [ep for ep in episodes if ep.episode_id in val_ids]
    if mine:
        return mine, "checkpoint validation split"
    return episodes, f"all episodes of {data_path} (not the checkpoint's training data)"


def evaluate_episodes(model: WorldModel, episodes: Sequence[EpisodeArrays], horizons: Sequence[int] = HORIZONS,
                      start_stride: int = 2, batch: int = 128) -> dict[str, Any]:
    hmax = max(horizons)
    starts = [(ep, t0) for ep in episodes for t0 in range(0, ep.num_steps, start_stride)]
    acc: dict[int, dict[str, list]] = {h: {"mse": [], "state_sq": [], "state_l2": [], "reward": [], "dis": [],
                                           "aux_sq": []} for h in horizons}
    succ_p, succ_l, term_p, term_l, dis1 = [], [], [], [], []
    for i in range(0, len(starts), batch):
        chunk = starts[i:i + batch]
        steps = min(hmax, max(ep.num_steps - t0 for ep, t0 in chunk))
        acts = np.zeros((len(chunk), steps, chunk[0][0].action.shape[1]), np.float32)
        for b, (ep, t0) in enumerate(chunk):
            n = min(steps, ep.num_steps - t0)
            acts[b, :n] = ep.action[t0:t0 + n]
        pred = open_loop(model, np.stack([ep.images[t0] for ep, t0 in chunk]),
                         np.stack([ep.state[t0] for ep, t0 in chunk]), [ep.instruction for ep, _ in chunk], acts)
        for b, (ep, t0) in enumerate(chunk):
            succ_p.append(float(pred["logits"][b, 0, 1])), succ_l.append(bool(ep.success[t0]))
            term_p.append(float(pred["logits"][b, 0, 0])), term_l.append(bool(ep.terminated[t0]))
            dis1.append(float(pred["disagreement"][b, 0]))
            for h in horizons:
                if t0 + h > ep.num_steps or h > steps:
                    continue
                real_img = ep.images[t0 + h].astype(np.float32) / 255.0
                a = acc[h]
                a["mse"].append(float(((pred["images"][b, h - 1] / 255.0 - real_img) ** 2).mean()))
                diff = pred["state"][b, h - 1] - ep.state[t0 + h]
                a["state_sq"].append(float((diff ** 2).mean()))
                a["state_l2"].append(float(np.linalg.norm(diff)))
                a["reward"].append(float(abs(pred["reward"][b, h - 1] - ep.reward[t0 + h - 1])))
                a["dis"].append(float(pred["disagreement"][b, h - 1]))
                if "aux" in pred and ep.aux is not None:
                    a["aux_sq"].append(float(((pred["aux"][b, h - 1] - ep.aux[t0 + h]) ** 2).mean()))
    per_h = {}
    for h, a in acc.items():
        if not a["mse"]:
            per_h[str(h)] = {"n": 0}
            continue
        mse = float(np.mean(a["mse"]))
        per_h[str(h)] = {"n": len(a["mse"]), "image_mse": mse,
                         "image_psnr_db": float(10 * np.log10(1.0 / max(mse, 1e-10))),
                         "state_rmse": float(np.sqrt(np.mean(a["state_sq"]))),
                         "state_l2": float(np.mean(a["state_l2"])), "reward_mae": float(np.mean(a["reward"])),
                         "disagreement_mean": float(np.mean(a["dis"]))}
        if a["aux_sq"]:
            per_h[str(h)]["aux_rmse"] = float(np.sqrt(np.mean(a["aux_sq"])))
    dis1 = np.asarray(dis1)
    return {"horizons": per_h,
            "success_head": head_scores(np.asarray(succ_p), np.asarray(succ_l, bool), float(model.done_threshold[1])),
            "terminated_head": head_scores(np.asarray(term_p), np.asarray(term_l, bool),
                                           float(model.done_threshold[0])),
            "disagreement_1step": {"p50": float(np.quantile(dis1, 0.5)), "p90": float(np.quantile(dis1, 0.9)),
                                   "p99": float(np.quantile(dis1, 0.99)),
                                   "frac_above_max": float((dis1 > model.cfg.max_disagreement).mean())},
            "episodes": len(episodes), "starts": len(starts)}


def save_strip(model: WorldModel, ep: EpisodeArrays, png_path: str | os.PathLike, steps: int = 16) -> Path:
    """PNG: real frames 0..steps (top) vs frames imagined open loop from frame 0 (bottom; frame 0 is real)."""
    from PIL import Image
    steps = min(steps, ep.num_steps)
    pred = open_loop(model, ep.images[:1], ep.state[:1], [ep.instruction], ep.action[None, :steps])["images"][0]
    real = ep.images[:steps + 1, ..., :3]
    imagined = np.concatenate([ep.images[:1, ..., :3], pred[..., :3]])
    path = Path(png_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(frame_strip(real, imagined)).save(path)
    return path


def wm_eval(checkpoint: str | os.PathLike, data_path: str | os.PathLike, out_json: str | os.PathLike | None = None,
            png_path: str | os.PathLike | None = None, *, max_episodes: int = 200) -> dict[str, Any]:
    """Evaluate a checkpoint on held-out episodes; writes the JSON (and PNG) and returns the results."""
    model = WorldModel.load(checkpoint)
    episodes, desc = load_episodes(data_path)
    if desc["state_dim"] != model.state_dim or desc["action_dim"] != model.action_dim or \
            desc["cameras"] != list(model.cameras):
        raise ValueError(f"{data_path} has cameras {desc['cameras']}, state_dim {desc['state_dim']}, action_dim "
                         f"{desc['action_dim']}; the model reads {list(model.cameras)}, {model.state_dim}, "
                         f"{model.action_dim}")
    held_out, which = _held_out(episodes, model, str(data_path))
    held_out = held_out[:max_episodes]
    results = {"checkpoint": str(checkpoint), "wm_version": model.version, "data": str(data_path),
               "held_out": which, **evaluate_episodes(model, held_out)}
    if png_path is not None:
        longest = max(held_out, key=lambda e: e.num_steps)
        results["png"] = str(save_strip(model, longest, png_path))
    if out_json is not None:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(results, indent=2))
    return results


def format_eval(results: dict[str, Any]) -> str:
    lines = [f"wm_version {results['wm_version']}  held out: {results['held_out']} ({results['episodes']} episodes)",
             f"{'h':>4}{'n':>7}{'img MSE':>10}{'PSNR dB':>9}{'state RMSE':>12}{'state L2':>10}{'rew MAE':>9}"
             f"{'disagree':>10}"]
    aux = any("aux_rmse" in r for r in results["horizons"].values())
    lines[-1] += f"{'aux RMSE':>10}" if aux else ""
    for h, r in results["horizons"].items():
        if r["n"]:
            lines.append(f"{h:>4}{r['n']:>7}{r['image_mse']:>10.4f}{r['image_psnr_db']:>9.1f}{r['state_rmse']:>12.4f}"
                         f"{r['state_l2']:>10.4f}{r['reward_mae']:>9.3f}{r['disagreement_mean']:>10.3f}"
                         + (f"{r['aux_rmse']:>10.4f}" if "aux_rmse" in r else ""))
        else:
            lines.append(f"{h:>4}{0:>7}  (no held-out episode is that long)")
    for head in ("success_head", "terminated_head"):
        r = results[head]
        fmt = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
        lines.append(f"{head}: precision {fmt(r['precision'])} recall {fmt(r['recall'])} at logit > 0; AUROC "
                     f"{fmt(r.get('auroc'))} average precision {fmt(r.get('average_precision'))} "
                     f"({r['positives']} positives / {r['n']})")
    d = results["disagreement_1step"]
    lines.append(f"1-step disagreement p50 {d['p50']:.3f} p90 {d['p90']:.3f} p99 {d['p99']:.3f}; "
                 f"{d['frac_above_max']:.1%} above wm.max_disagreement")
    return "\n".join(lines)
