"""`acce train --data DATASET`: a policy for a robot's own LeRobotDataset, with no simulator and no scripted expert.

Phases: the dataset -> the run's episode store (`demos.zarr`, imported with `dataset.*`; an acce episode store is
used as it is) -> held-out episodes set aside -> a policy built for the dataset's env spec (its widths, cameras,
rate and action units) -> behavior cloning on the other episodes (`bc.*` budgets) -> open-loop evaluation ->
optionally (acce/dataset_rl.py) a world model trained `dataset.wm_steps` steps on the same episodes, with success
and reward labels from their outcomes (`dataset.success`, acce/dataset_labels.py), then `train.max_versions` learner
versions of RL in imagination from the training episodes' states, and the open-loop evaluation again beside the
imagined success of version 0 and the final policy -> `checkpoints/latest.pt` (the final policy; `bc.pt` the cloned
one when RL ran), which `acce serve` serves and `acce robot` runs like any other checkpoint.

Evaluation without a simulator cannot measure success. What it measures, and labels as such, is the open-loop
action error: from each recorded observation of a held-out episode (no committed prefix, delay 0), the policy's mean
chunk against the H actions the demonstrator took next, as a mean squared error in the policy's [-1, 1] units (the
`baseline` is the same error of always predicting the training episodes' mean action) and as the first action's
mean absolute error in the data's own units (degrees, ...). A low error is necessary, not sufficient: errors
compound once the robot acts on its own predictions. Held out are the last `dataset.heldout_fraction` of the
episodes in recording order (later sessions drift most), at least one when there are two or more.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from acce.config import Config
from acce.configlib import ConfigError, save_config, to_dict
from acce.data_kind import data_kind
from acce.types import EnvSpec, Episode

EVAL_LABEL = "open-loop action error on recorded episodes (no simulator: not a success rate)"


def dataset_store(cfg: Config, run_dir: Path):
    """The episodes to learn from: an acce store at dataset.path as is, else the dataset imported into
    run_dir/demos.zarr (a second run in the same directory reuses that import)."""
    from acce.store.episodes import EpisodeStore
    from acce.store.lerobot_import import import_lerobot

    src = Path(cfg.dataset.path)
    if data_kind(src) == "zarr":
        return EpisodeStore.open(src)
    demos = run_dir / "demos.zarr"
    if data_kind(demos) == "zarr" and len(EpisodeStore.open(demos)):
        return EpisodeStore.open(demos)
    return import_lerobot(src, demos, config=cfg.dataset)


def split_episodes(episodes: list[Episode], heldout_fraction: float) -> tuple[list[Episode], list[Episode]]:
    """(training, held-out): the last round(n * fraction) episodes, at least one of two or more, none of one."""
    n = len(episodes)
    held = 0 if n < 2 or heldout_fraction <= 0 else min(n - 1, max(1, round(n * heldout_fraction)))
    return episodes[:n - held], episodes[n - held:]


def open_loop_error(policy, episodes: list[Episode], spec: EnvSpec, mean_action: np.ndarray,
                    batch_size: int = 64) -> dict[str, Any]:
    """The policy's mean chunk from every recorded observation against the recorded next H actions (masked past an
    episode's end): mse in [-1, 1] units, the constant mean-action baseline's mse, and the first action's mean
    absolute error per dim in the data's units."""
    import torch

    from acce.bc import DemoDataset

    H, D = policy.config.chunk_len, policy.config.max_delay_steps
    data = DemoDataset(episodes, H, D, spec.action_dim)
    sq = base_sq = weight = 0.0
    abs_first = np.zeros(spec.action_dim)
    policy.eval()
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            inputs, target, mask = data.batch(np.arange(start, min(start + batch_size, len(data))))
            mean = policy(policy.with_lang(inputs))[0].float().cpu().numpy().clip(-1.0, 1.0)  # (B, H, A) as run
            m = mask[..., None].astype(np.float64)
            sq += float((((mean - target) ** 2) * m).sum())
            base_sq += float((((mean_action - target) ** 2) * m).sum())
            weight += float(m.sum()) * spec.action_dim
            abs_first += np.abs(spec.to_units(mean[:, 0]) - spec.to_units(target[:, 0])).sum(0)
    names = spec.action_names or tuple(f"action_{i}" for i in range(spec.action_dim))
    mae = abs_first / len(data)
    return {"episodes": len(episodes), "decisions": len(data), "mse": sq / weight, "baseline_mse": base_sq / weight,
            "first_action_mae_units": float(mae.mean()), "first_action_mae_per_dim": dict(zip(names, mae.tolist()))}


def _checks(cfg: Config) -> None:
    """Contradictions in the config, before anything is imported or written."""
    from acce.dataset_rl import check_image_size

    if cfg.bc.steps <= 0:
        raise ConfigError("acce train --data clones the dataset: set bc.steps > 0 (e.g. bc.steps=2000)")
    if cfg.bc.aux_loss_coef > 0 or cfg.policy.aux_input or cfg.policy.critic == "privileged":
        raise ConfigError("a dataset has no simulator's privileged labels: set bc.aux_loss_coef=0, "
                          "policy.aux_input=false and policy.critic=trunk")
    if cfg.train.max_versions > 0 and not cfg.dataset.wm_steps:
        raise ConfigError(f"RL in imagination (train.max_versions={cfg.train.max_versions}) needs a world model: set "
                          "dataset.wm_steps > 0 (e.g. 2000), or train.max_versions=0 to clone only")
    if cfg.dataset.wm_steps and cfg.dataset.image_size:
        check_image_size(cfg.dataset.image_size)


def _open_loop(policy, train_eps, heldout, spec, mean_action, metrics, version: int) -> dict[str, Any]:
    """Open-loop action errors of `policy` (TensorBoard at its learner version: the cloned policy is version 0)."""
    evaluation = {"label": EVAL_LABEL, "train": open_loop_error(policy, train_eps, spec, mean_action)}
    if heldout:
        evaluation["heldout"] = open_loop_error(policy, heldout, spec, mean_action)
    for split in ("train", "heldout"):
        if split in evaluation:
            e = evaluation[split]
            metrics.scalars({f"eval/open_loop/mse/{split}": e["mse"],
                             f"eval/open_loop/baseline_mse/{split}": e["baseline_mse"],
                             f"eval/open_loop/first_action_mae_units/{split}": e["first_action_mae_units"]}, version)
    return evaluation


def train_on_dataset(cfg: Config, progress: bool = True) -> dict[str, Any]:
    """Clone the dataset at cfg.dataset.path into a policy for its env spec, then (dataset.wm_steps > 0) pretrain a
    world model on it and (train.max_versions > 0) run RL in imagination; returns the run's summary."""
    from acce.action_rates import store_action_rates
    from acce.bc import DemoDataset, bc_train
    from acce.checkpoint import save_checkpoint
    from acce.dataset_labels import apply_labels, episode_flags, resolve_success
    from acce.device import driver_device, place
    from acce.metrics import Metrics
    from acce.policy.build import build_policy
    from acce.runtime.learner import make_learner

    _checks(cfg)
    use_wm, rl = cfg.dataset.wm_steps > 0, cfg.train.max_versions > 0
    success = resolve_success(cfg.dataset)  # a misnamed label feature fails even when no world model reads it
    if cfg.runtime.driver_threads > 0:  # this process clones, trains the world model and runs RL (as acce train)
        import torch
        torch.set_num_threads(cfg.runtime.driver_threads)
    run_dir = cfg.run.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    store = dataset_store(cfg, run_dir)
    spec = store.schema.env_spec
    rates = store_action_rates(store, cfg.dataset.max_rate_percentile, cfg.dataset.max_rate_margin)
    episodes = list(store.iter_episodes())
    train_eps, heldout = split_episodes(episodes, cfg.dataset.heldout_fraction)
    summary: dict[str, Any] = {}
    if use_wm:  # labels first: a dataset RL could learn nothing from fails before any training
        from acce.dataset_rl import check_image_size, world_model_arrays
        check_image_size(spec.image_size)
        flags = None if success in ("data", "last_step", "none") else episode_flags(cfg.dataset, success,
                                                                                    len(episodes))
        arrays, summary["labels"] = apply_labels(world_model_arrays(episodes, spec), success, flags)
        if rl and not summary["labels"]["successful_episodes"] and summary["labels"]["reward"] != "recorded":
            raise ConfigError(f"RL in imagination has nothing to maximize: {cfg.dataset.path} has no rewards and "
                              f"dataset.success={cfg.dataset.success} marks no episode successful; set "
                              "dataset.success=last_step (or a feature marking the successful episodes)")
    data = DemoDataset(train_eps, cfg.policy.chunk_len, cfg.policy.max_delay_steps, spec.action_dim)
    device = driver_device(cfg.runtime)
    policy = place(build_policy(cfg, data.states, aux_dim=0, spec=spec, privileged_dim=0), device, cfg.runtime.amp)
    learner = make_learner(policy, cfg.learner, seed=cfg.run.seed)
    learner.reset_optimizer(cfg.bc.lr)
    metrics = Metrics(run_dir / "tb")
    t0 = time.time()
    ckpt_dir = run_dir / "checkpoints"
    try:
        losses = bc_train(learner, data, cfg.bc.steps, cfg.bc.batch_size, seed=cfg.run.seed, progress=progress,
                          metrics=metrics, augment_px=cfg.bc.augment_shift_px, lr_schedule=cfg.bc.lr_schedule,
                          desc="cloning the dataset", max_wall_s=cfg.bc.max_wall_s)
        bc = {"bc_steps": len(losses), "bc_final_loss": float(np.mean(losses[-20:])), "bc_time_s": time.time() - t0}
        mean_action = (data.targets * data.masks[..., None]).sum((0, 1)) / max(data.masks.sum(), 1)
        evaluation = _open_loop(policy, train_eps, heldout, spec, mean_action, metrics, 0)
        state0 = policy.policy_state()
        if use_wm:
            from acce.dataset_rl import IMAGINED_LABEL, imagined_success, pretrain_world_model, rl_in_imagination
            n_train = len(train_eps)
            model, wm = pretrain_world_model(cfg, spec, arrays[:n_train], arrays[n_train:], run_dir, progress)
            summary["wm"] = {k: wm[k] for k in ("checkpoint", "wm_version", "steps", "wall_s", "train_loss_final",
                                                "val_loss_initial", "val_loss_final", "episodes")}
            starts = heldout or train_eps
            imagined = {"label": IMAGINED_LABEL, "start_states": "heldout" if heldout else "train",
                        "horizon": cfg.wm.horizon, "v0": imagined_success(cfg, state0, 0, model, starts, policy)}
            summary["imagined"] = imagined
        if rl:
            save_checkpoint(ckpt_dir / "bc.pt", {"config": to_dict(cfg), "learner": {"policy": state0, "version": 0},
                                                 "counters": {"bc": bc}})
            summary["rl"] = rl_in_imagination(cfg, learner, model, train_eps, metrics, progress)
            final = _open_loop(policy, train_eps, heldout, spec, mean_action, metrics, learner.version)
            evaluation = {**final, "version": learner.version,
                          "v0": {k: v for k, v in evaluation.items() if k != "label"}}
            imagined["final"] = imagined_success(cfg, policy.policy_state(), learner.version, model, starts, policy)
    finally:
        metrics.close()
    path = save_checkpoint(ckpt_dir / "latest.pt", {
        "config": to_dict(cfg), "learner": {"policy": policy.policy_state(), "version": learner.version},
        "counters": {"bc": bc, **({"rl": summary["rl"]} if rl else {})},
        "dataset": {"path": cfg.dataset.path, "train_episodes": len(train_eps), "heldout_episodes": len(heldout)},
        **({"action_rates": rates.to_dict()} if rates is not None else {})})  # a copied checkpoint keeps its limits
    summary = {"run_dir": str(run_dir), "checkpoint": str(path), "env_spec": spec.to_dict(),
               "episodes": {"train": len(train_eps), "heldout": len(heldout)}, **bc, "eval": evaluation, **summary}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if progress:
        print(format_summary(summary))
    return summary


def _open_loop_lines(ev: dict[str, Any]) -> list[str]:
    lines = []
    for split in ("train", "heldout"):
        if split in ev:
            e = ev[split]
            lines.append(f"  {split:<8} {e['episodes']} episodes: mse {e['mse']:.4f} (mean-action baseline "
                         f"{e['baseline_mse']:.4f}), first action mean abs error {e['first_action_mae_units']:.3g} "
                         "data units")
    return lines


def _imagined_line(name: str, r: dict[str, Any]) -> str:
    lo, hi = r["ci95"]
    return (f"  {name:<9} (version {r['version']}): {r['success_rate']:.1%} [{lo:.1%}, {hi:.1%}] of {r['n']} "
            f"branches, mean length {r['mean_length']:.1f}")


def format_summary(summary: dict[str, Any]) -> str:
    ev, spec = summary["eval"], summary["env_spec"]
    lines = [f"cloned {summary['episodes']['train']} episodes ({summary['bc_steps']} steps, final loss "
             f"{summary['bc_final_loss']:.4f}); policy for state {spec['state_dim']}, action {spec['action_dim']} "
             f"({spec['action_repr']}), {spec['control_hz']:g} Hz, cameras {spec['cameras']}"]
    if "wm" in summary:
        wm, labels = summary["wm"], summary["labels"]
        val = wm["val_loss_final"]
        source = "the data's own" if labels["success"] == "data" else labels["success"]
        lines.append(f"world model: {wm['steps']} steps on {wm['episodes']['train']} episodes (success labels "
                     f"{source}: {labels['successful_episodes']}/{labels['episodes']} episodes succeed; "
                     f"reward {labels['reward']})" + (f", held-out loss {wm['val_loss_initial']['total']:.3f} -> "
                                                      f"{val['total']:.3f}" if val else "") + f"; {wm['checkpoint']}")
    if "rl" in summary:
        rl = summary["rl"]
        lines.append(f"RL in imagination (source=imagined, no simulator): {rl['versions']} learner versions in "
                     f"{rl['updates']} updates on {rl['imagined_steps']} imagined steps, {rl['wall_s']:.0f} s")
        lines.append(ev["label"] + " (version 0, cloned):")
        lines += _open_loop_lines(ev["v0"])
        lines.append(f"{ev['label']} (version {ev['version']}, after RL):")
    else:
        lines.append(ev["label"] + ":")
    lines += _open_loop_lines(ev)
    if "imagined" in summary:
        im = summary["imagined"]
        lines.append(f"{im['label']}; deterministic actions, up to {im['horizon']} steps from {im['start_states']} "
                     "episodes' states:")
        lines += [_imagined_line(name, im[key]) for key, name in (("v0", "cloned"), ("final", "after RL"))
                  if key in im]
    lines.append(f"checkpoint {summary['checkpoint']} (serve it: acce serve --checkpoint {summary['run_dir']})")
    return "\n".join(lines)
