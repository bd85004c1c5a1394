"""Diagnostic (BENCHMARKS.md, metaworld/push-v3): where a Meta-World object task's failing episodes go wrong.

    python scripts/diagnostics/mw_failures.py CKPT --episodes 50 --out failures.json [--split val]

Runs `acce eval` in this process with `MetaWorldEnv` patched to log, per episode and from Meta-World's privileged
observation (never a policy input): success, steps, the closest the hand came to the first object in the table plane,
how far the object moved, and the object's distance to the goal at the start and at the end. Prints percentiles for
successes and failures and how many failures never brought the hand within 2 cm of the object (where the scripted
push policy closes the gripper), never moved it 2 cm, or ended within 10 cm of the goal. Only the split's own seeds
count (not the spare seeds the vector env runs on once they are used up).
"""
from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

HAND = slice(0, 2)
"""xy of the hand in Meta-World's (39,) observation (the object's and goal's slices are the env's aux labels')"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--episodes", type=int, default=50)
    p.add_argument("--split", default="val", choices=("val", "test"))
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import sim.metaworld_env as mwe
    from acce.cli import main as acce_main
    from sim.metaworld_env import AUX_GOAL_XY as GOAL, AUX_OBJECT_XY as OBJECT

    records: list[dict[str, Any]] = []
    live: dict[int, dict[str, Any]] = {}
    reset0, step0 = mwe.MetaWorldEnv.reset, mwe.MetaWorldEnv.step_no_render

    def reset(self, *, seed=None, options=None):
        live.pop(id(self), None)  # an episode cut short by a reset is not counted
        out = reset0(self, seed=seed, options=options)
        o = self._mw_obs
        live[id(self)] = {"seed": seed, "steps": 0, "success": False, "min_hand_object_m": float("inf"),
                          "object0": o[OBJECT].tolist(), "travel_m": 0.0,
                          "goal_start_m": float(np.linalg.norm(o[OBJECT] - o[GOAL])), "goal_end_m": None}
        return out

    def step(self, action):
        out = step0(self, action)
        r, o = live.get(id(self)), self._mw_obs
        if r is not None:
            r["steps"] += 1
            r["success"] |= bool(out[3]["success"])
            r["min_hand_object_m"] = min(r["min_hand_object_m"], float(np.linalg.norm(o[HAND] - o[OBJECT])))
            r["travel_m"] = float(np.linalg.norm(o[OBJECT] - np.asarray(r["object0"])))
            r["goal_end_m"] = float(np.linalg.norm(o[OBJECT] - o[GOAL]))
            if out[1] or out[2]:
                records.append(live.pop(id(self)))
        return out

    mwe.MetaWorldEnv.reset, mwe.MetaWorldEnv.step_no_render = reset, step
    eval_out = args.out + ".eval.json"
    acce_main(["eval", "--checkpoint", args.checkpoint, "--split", args.split, "--instructions", "heldout",
               "--episodes", str(args.episodes), "--out", eval_out])
    with open(eval_out) as f:
        cells = json.load(f)["per_task"]
    if len(cells) != 1:
        raise SystemExit(f"expected one Meta-World task in the checkpoint's run, got {sorted(cells)}")
    lo, hi = next(iter(cells.values()))["seeds"]
    records = [r for r in records if r["seed"] is not None and lo <= r["seed"] <= hi]
    ok, bad = [r for r in records if r["success"]], [r for r in records if not r["success"]]

    def pct(rs: list[dict[str, Any]], key: str) -> list[float] | None:
        return [round(float(np.percentile([r[key] for r in rs], q)), 3) for q in (10, 50, 90)] if rs else None

    summary = {"episodes": len(records), "successes": len(ok),
               **{f"{key}_{name}_p10_p50_p90": pct(rs, key)
                  for key in ("min_hand_object_m", "travel_m", "goal_start_m", "goal_end_m", "steps")
                  for name, rs in (("success", ok), ("failure", bad))},
               "failures_hand_never_within_2cm": sum(r["min_hand_object_m"] > 0.02 for r in bad),
               "failures_object_moved_under_2cm": sum(r["travel_m"] < 0.02 for r in bad),
               "failures_ending_within_10cm_of_goal": sum(r["goal_end_m"] < 0.10 for r in bad)}
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "episodes": records}, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
