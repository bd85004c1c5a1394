"""`acce wm-pretrain`: train a world model offline on a zarr episode store or a LeRobotDataset v3 directory.

Episodes are split into train and validation BY EPISODE (frames of one episode are strongly correlated, so a
frame-level split would leak). Training runs the online trainer's optimizer step (WorldModelTrainer) with a tqdm
bar; TensorBoard (<out>/tb, x-axis = wm version) gets the wm/* losses, validation losses and side-by-side real vs
open-loop predicted frames. The checkpoint (<out>/worldmodel.pt) describes itself: config, dims, normalization,
the data it saw (path, tasks, validation episode ids) and its version; <out>/pretrain.json holds the summary.
Data with privileged aux labels (a store with frames/aux) give the model an aux head (what a privileged critic needs
to value imagined states); data without them give none, and one printed line says so.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from acce.metrics import Metrics
from worldmodel.config import WMConfig
from worldmodel.data import EpisodeArrays, load_episodes, split_by_episode, validation_windows
from worldmodel.evaluate import frame_strip, open_loop
from worldmodel.model import WorldModel
from worldmodel.trainer import WorldModelTrainer

CHECKPOINT_NAME = "worldmodel.pt"


def _check_images(desc: dict[str, Any], cfg: WMConfig) -> None:
    wrong = {c: s for c, s in desc["image_shapes"].items() if tuple(s) != (cfg.image_size, cfg.image_size)}
    if wrong:
        raise ValueError(f"{desc['path']} has images {wrong} (H, W) but wm.image_size={cfg.image_size}; set "
                         f"wm.image_size to the data's size or record data at that size (env.image_size)")


def _val_strip(model: WorldModel, batch: dict[str, np.ndarray]) -> np.ndarray:
    """Real frames of the first validation window (top) vs frames predicted open loop from its first frame."""
    n = int(batch["mask"][0].sum())
    pred = open_loop(model, batch["images"][:1, 0], batch["state"][:1, 0], batch["instruction"][:1],
                     batch["action"][:1, :n])["images"][0]
    real = batch["images"][0, :n + 1, ..., :3]
    return frame_strip(real, np.concatenate([real[:1], pred[..., :3]]))


def pretrain(data_path: str | os.PathLike, out_dir: str | os.PathLike, cfg: WMConfig, steps: int, *,
             progress: bool = True, tensorboard: bool = True, log_every: int = 10,
             torch_threads: int | None = 1) -> dict[str, Any]:
    """Train for `steps` optimizer steps; returns the summary (also written to <out_dir>/pretrain.json).

    torch_threads=1 by default: on a shared 2-core machine two intra-op threads made a 64x64 step 12x slower
    (0.58 vs 7.2 steps/s, measured); None keeps torch's setting (use it on a GPU or an idle many-core host)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    episodes, desc = load_episodes(data_path)
    _check_images(desc, cfg)
    train_idx, val_idx = split_by_episode(len(episodes), cfg.val_fraction, cfg.seed)
    train_eps, val_eps = [episodes[i] for i in train_idx], [episodes[i] for i in val_idx]
    if not validation_windows(val_eps, cfg.seq_len):
        raise ValueError(f"the {len(val_eps)} validation episodes of {data_path} have no transitions; "
                         "raise wm.val_fraction or record longer episodes")
    aux_dim = int(desc.get("aux_dim") or 0)
    if not aux_dim:
        print(f"wm-pretrain: {data_path} has no aux labels (frames/aux): the world model gets no aux head, so "
              "policy.critic=privileged cannot use it for imagination (record with `acce collect --aux-labels`)",
              flush=True)
    with torch.random.fork_rng():  # seeded init without moving the caller's global RNG
        torch.manual_seed(cfg.seed)
        model = WorldModel(cfg, state_dim=desc["state_dim"], action_dim=desc["action_dim"],
                           cameras=tuple(desc["cameras"]), control_hz=desc["control_hz"], aux_dim=aux_dim)
    model.data_info = {"path": desc["path"], "kind": desc["kind"], "num_episodes": len(episodes),
                       "num_transitions": int(sum(e.num_steps for e in episodes)),
                       "tasks": desc["summary"]["tasks"], "train_episodes": len(train_eps),
                       "val_episode_ids": [e.episode_id for e in val_eps], "steps": steps}
    summary = train_model(model, train_eps, val_eps, out_dir, steps, progress=progress, tensorboard=tensorboard,
                          log_every=log_every, torch_threads=torch_threads)
    summary["data"] = desc["path"]
    (Path(out_dir) / "pretrain.json").write_text(json.dumps(summary, indent=2))
    return summary


def train_model(model: WorldModel, train_eps: list[EpisodeArrays], val_eps: list[EpisodeArrays],
                out_dir: str | os.PathLike, steps: int, *, progress: bool = True, tensorboard: bool = True,
                log_every: int = 10, torch_threads: int | None = 1) -> dict[str, Any]:
    """`steps` optimizer steps of the online trainer's step on `train_eps` (validated on `val_eps`; none: no
    validation); saves <out_dir>/worldmodel.pt and returns the summary. `pretrain` and `acce train --data` (which
    gives its own split and outcome labels) both train through here."""
    from tqdm import tqdm

    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    cfg, out_dir = model.cfg, Path(out_dir)
    trainer = WorldModelTrainer(model, capacity_episodes=len(train_eps), seed=cfg.seed)
    trainer.add_arrays(train_eps)
    val_batches = validation_windows(val_eps, cfg.seq_len)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = Metrics(out_dir / "tb", enabled=tensorboard)

    def validate() -> dict[str, float] | None:
        if not val_batches:
            return None
        val = trainer.evaluate(val_batches)
        metrics.scalars({f"wm/val/{k}": v for k, v in val.items()}, trainer.version)
        metrics.image("wm/frames/val", _val_strip(trainer.model, val_batches[0]), trainer.version)
        return val

    val_initial = validate()
    history: list[dict[str, float]] = []
    bar = tqdm(total=steps, desc="wm-pretrain", unit="step", disable=not progress, dynamic_ncols=True)
    t0, val = time.perf_counter(), val_initial
    done = 0
    while done < steps:
        n = min(log_every, steps - done, cfg.val_every - trainer.version % cfg.val_every)
        m = trainer.train_steps(n)
        done += n
        metrics.scalars(m, trainer.version)
        history.append({"version": trainer.version, "loss": m["wm/loss/total"]})
        bar.update(n)
        bar.set_postfix({"loss": f"{m['wm/loss/total']:.3f}", "val": f"{val['total']:.3f}" if val else "-"})
        if trainer.version % cfg.val_every == 0 or done == steps:
            val = validate()
    bar.close()
    elapsed = time.perf_counter() - t0
    path = model.save(out_dir / CHECKPOINT_NAME)
    metrics.close()
    return {"checkpoint": str(path), "wm_version": model.version, "steps": steps, "wall_s": elapsed,
            "steps_per_s": steps / elapsed, "train_loss_final": history[-1]["loss"],
            "val_loss_initial": val_initial, "val_loss_final": val, "parameters": model.num_parameters(),
            "episodes": {"train": len(train_eps), "val": len(val_eps)}}
