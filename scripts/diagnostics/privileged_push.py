"""Diagnostic (BENCHMARKS.md, the main job): is push's bottleneck perception or control?

    python scripts/diagnostics/privileged_push.py priv       # state = proprio (7) + named cube xy + named pad xy
    python scripts/diagnostics/privileged_push.py priv_pad   # proprio + the named pad's xy only (cube from pixels)
    python scripts/diagnostics/privileged_push.py priv_cube  # proprio + the named cube's xy only (pad from pixels)
    python scripts/diagnostics/privileged_push.py plain      # the same run without them
    python scripts/diagnostics/privileged_push.py aux        # the main job's perception path: positions learned
                                                             # from pixels (aux targets, never inputs)

The oracle modes and `plain` use the policy of the main job before its perception aux loss (no keypoints, no aux
targets, random-shift augmentation); `aux` keeps configs/default.yaml's perception settings.

Push alone: 500 demos, 1,500 BC steps, one DAgger round of 150 episodes; then evaluated on 50 test seeds per split.
The runs go to runs/diag_<mode>. Extra arguments are config overrides (e.g. run.seed=1 run.name=other).
`priv` patches TabletopEnv.proprio in this process only, so the runtime is local. It appends the privileged
positions, which no real robot has: this is an oracle, never a training mode.
"""
from __future__ import annotations

import argparse

import numpy as np

def add_privileged_state(cube: bool, pad: bool) -> None:
    import sim.env as senv
    from acce.store.episodes import EpisodeStore

    proprio = senv.TabletopEnv.proprio

    def with_positions(self) -> np.ndarray:
        task, scene = self.task, self.scene
        extra = np.concatenate([scene.cube_pos(task.cube)[:2]] * cube + [scene.pad_pos(task.pad)[:2]] * pad)
        return np.concatenate([proprio(self), extra]).astype(np.float32)

    senv.TabletopEnv.proprio = with_positions
    create = EpisodeStore.open_or_create.__func__  # the demo store must hold the wider state too
    EpisodeStore.open_or_create = classmethod(
        lambda cls, path, **kw: create(cls, path, **{**kw, "state_dim": kw["state_dim"] + 2 * (cube + pad)}))


BEFORE_AUX = ["bc.aux_loss_coef=0", "policy.keypoints=0", "policy.aux_from=trunk", "policy.aux_input=false",
              "bc.augment_shift_px=3"]
"""the main job's policy and cloning before the perception aux loss (what the oracle rows were measured with)"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["priv", "priv_pad", "priv_cube", "plain", "aux"],
                        help="priv*: oracle object positions (metres) appended to the state")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args()
    if args.mode.startswith("priv"):
        add_privileged_state(cube=args.mode in ("priv", "priv_cube"), pad=args.mode in ("priv", "priv_pad"))
    from acce.config import load
    from acce.train import Trainer
    cfg = load("configs/default.yaml", [
        "env.tasks=[push]", "collect.tasks=[push]", "runtime.kind=local", "bc.episodes=500", "bc.steps=1500",
        "bc.dagger_rounds=1", "bc.dagger_episodes=150", "train.max_wall_s=0", "train.max_versions=2",
        "eval.every_versions=0", "train.select_on_val=false", "eval.episodes_per_task=50", f"run.name=diag_{args.mode}",
        *([] if args.mode == "aux" else BEFORE_AUX), *args.overrides])
    summary = Trainer(cfg, progress=False).run()
    for cell, r in summary["eval"].items():
        print(f"{cell}: {r['successes']}/{r['n']} ({100 * r['success_rate']:.0f} %)")
    print("warm start:", summary["bc"])


if __name__ == "__main__":
    main()
