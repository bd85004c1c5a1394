"""Diagnostic (BENCHMARKS.md, the main job): the warm start's policy after each cloning phase, and its DAgger labels.

    python scripts/diagnostics/warmstart_phases.py --run-dir DIR --out F.json [--config configs/default.yaml]
        [--episodes 100] [overrides...]

Runs the preset's warm start (`acce.warmstart.bc_warmstart`: demos recorded into DIR, cloning, DAgger rounds) and keeps
the policy as it was before each DAgger round and at the end. Each is then run, deterministically and with the DAgger
rollout code, on --episodes fresh training layouts per task (training paraphrases): its success is what the round's
own `bc/dagger_success` reports for the policy of that moment, measured the same way for every phase, the last
included. With DAgger rounds it also compares the expert's labels of the policy's states with the demos' actions
(`up_share`: the share of steps whose z command is above 0.5, a strong lift; per round, for won and lost episodes),
which is how the scripted pusher's labels were found to halve push (docs/decisions.md, "No DAgger in the main job's
warm start").
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

UP = 0.5
"""a z command above this is a strong lift (actions are in [-1, 1], z is the third dimension)"""


def up_share(actions: list[np.ndarray]) -> float | None:
    return float(np.mean(np.concatenate(actions)[:, 2] > UP)) if actions else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/default.yaml")
    p.add_argument("--run-dir", required=True, help="where the demos are recorded (reused when present)")
    p.add_argument("--out", default=None)
    p.add_argument("--episodes", type=int, default=100, help="fresh training layouts per task and phase")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()

    import acce.dagger as dagger
    from acce.config import Config
    from acce.configlib import load_config
    from acce.metrics import Metrics
    from acce.policy.vla import VLAPolicy
    from acce.store.episodes import EpisodeStore
    from acce.warmstart import bc_warmstart
    from acce.wiring import eval_env_factory

    cfg = load_config(Config, args.config, list(args.overrides))
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    phases: list[dict] = []
    rounds: list[dict] = []
    rollouts = dagger.dagger_rollouts

    def recorded(policy, *a, **k):  # the policy of this moment, then the round itself with its labels
        phases.append(policy.policy_state())
        episodes, labels, success = rollouts(policy, *a, **k)
        rounds.append({task: {"policy_success": success.get(task),
                              "up_share_won": up_share([y for e, y in zip(episodes, labels)
                                                        if e.task == task and e.is_success]),
                              "up_share_lost": up_share([y for e, y in zip(episodes, labels)
                                                         if e.task == task and not e.is_success]),
                              "up_share_executed": up_share([e.action for e in episodes if e.task == task])}
                       for task in cfg.env.tasks})
        return episodes, labels, success

    dagger.dagger_rollouts = recorded
    try:
        learner, _ = bc_warmstart(cfg, run_dir, Metrics(run_dir / "tb"), progress=True)
    finally:
        dagger.dagger_rollouts = rollouts
    phases.append(learner.policy.policy_state())
    demos = list(EpisodeStore.open(run_dir / "demos.zarr").iter_episodes())

    make_env = eval_env_factory(cfg, aux_labels=cfg.bc.aux_loss_coef > 0)  # the warm start's envs, as it makes them
    result = {"config": args.config, "overrides": list(args.overrides), "episodes_per_task": args.episodes,
              "demo_up_share": {t: up_share([e.action for e in demos if e.task == t]) for t in cfg.env.tasks},
              "dagger_rounds": rounds, "phases": []}
    for k, state in enumerate(phases):
        success = rollouts(VLAPolicy.from_state(state), make_env, list(cfg.env.tasks),
                           args.episodes * len(cfg.env.tasks), chunk_len=cfg.policy.chunk_len,
                           exec_horizon=cfg.rollout.execution_horizon, num_envs=cfg.env.num_envs, seed=7,
                           progress=False, max_delay=cfg.policy.max_delay_steps, groups=cfg.bc.dagger_groups,
                           task_weights={t: 1.0 for t in cfg.env.tasks})[2]
        result["phases"].append({"phase": k + 1, "success": success})
        print(f"after cloning phase {k + 1}/{len(phases)}: " + ", ".join(f"{t} {v:.0%}" for t, v in success.items()),
              flush=True)
    for r, per_task in enumerate(rounds):
        print(f"DAgger round {r + 1} labels, share of strong lifts (z > {UP}): " + "; ".join(
            f"{t}: won {v['up_share_won']}, lost {v['up_share_lost']}, executed {v['up_share_executed']}, demos "
            f"{result['demo_up_share'][t]}" for t, v in per_task.items()), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
