"""What the benches count and time, the same way for every arm (issue 16, "bench fairness").

- Env steps are the ones the learner CONSUMED (control steps of the simulator segments its updates used), not the
  ones actors produced: an async run stops with segments still queued or in flight, and segments the staleness
  filter excludes were produced but never learned from. The learner reports the running total as the metric
  `learner/consumed_env_steps` at every update (x-axis: learner version); a run's evaluation at version V is
  credited with the total of the last update at or before V.
- Wall-clock starts at the first learner update: starting actors (processes, envs, policies, the first batch)
  is reported apart as `startup_s`, not charged to the mode that happens to start slower.
- Which mode or arm runs first alternates (`mode_order`), so a machine that gets busier during a bench does not
  always favour the same one.

The trainer's summary.json records produced env steps and wall-clock from the runtime's start; the consumed totals
and the first update's time are read back from the run's TensorBoard events. A run without them (made before the
learner reported them) keeps the trainer's numbers and says so (`counted: "produced"`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

CONSUMED_TAG = "learner/consumed_env_steps"
NO_PERIODIC_EVAL = ("eval.every_versions=0", "train.select_on_val=false")
"""overrides of a bench run that evaluates nothing while it trains (a warm start, a throughput run): no periodic
validation, hence nothing for train.select_on_val to choose from, which a preset may have on"""


def mode_order(seed: int, modes) -> tuple:
    """The modes (or arms) rotated by the seed: seed k starts with modes[k % n]. Two modes: even seeds in the given
    order, odd seeds reversed; three arms: each goes first once in three seeds."""
    k = seed % max(len(modes), 1)
    return tuple(modes[k:]) + tuple(modes[:k])


def read_timeline(run_dir: str | Path) -> dict[str, Any] | None:
    """From a run's TensorBoard events: {"consumed": [(version, consumed env steps), ...] in update order,
    "update_s": [seconds from the runtime's start to each of those updates], "startup_s": the first of them}.
    Times are None without progress points. None when the run has no consumed counts (no events, an older run)."""
    tb = Path(run_dir) / "tb"
    if not tb.is_dir():
        return None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0, "images": 1, "histograms": 1, "tensors": 1})
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    if CONSUMED_TAG not in tags:
        return None
    consumed = acc.Scalars(CONSUMED_TAG)
    update_s = None
    if "progress/wall_s" in tags:  # each progress point is written right after its wall_s was read: the earliest
        # (event time - value) is the runtime's start
        t0 = min(e.wall_time - e.value for e in acc.Scalars("progress/wall_s"))
        update_s = [max(0.0, e.wall_time - t0) for e in consumed]
    return {"consumed": [(int(e.step), int(e.value)) for e in consumed], "update_s": update_s,
            "startup_s": update_s[0] if update_s else None}


def consumed_at(consumed: list[tuple[int, int]], version: int) -> int:
    """Consumed env steps of the last update at or before `version` (0 before the first)."""
    total = 0
    for v, steps in consumed:
        if v > version:
            break
        total = steps
    return total


def fair_counts(summary: dict[str, Any], timeline: dict[str, Any] | None) -> dict[str, Any]:
    """A run's totals and evaluation history in the bench's units. `env_steps` = consumed, `wall_s` = since the first
    update (evaluations before it at 0); the trainer's own numbers stay beside them as `env_steps_produced` and
    `wall_total_s`."""
    hist = summary.get("history", [])
    if timeline is None:
        return {"counted": "produced", "env_steps": summary["env_steps"], "env_steps_produced": summary["env_steps"],
                "wall_s": summary["wall_s"], "wall_total_s": summary["wall_s"], "startup_s": None,
                "history": [dict(h) for h in hist]}
    start = timeline["startup_s"] or 0.0
    rows = [{**h, "env_steps": consumed_at(timeline["consumed"], int(h.get("version", 0))),
             "env_steps_produced": h.get("env_steps"), "wall_s": max(0.0, float(h.get("wall_s", 0.0)) - start),
             "wall_total_s": h.get("wall_s")} for h in hist]
    return {"counted": "consumed", "env_steps": timeline["consumed"][-1][1], "env_steps_produced": summary["env_steps"],
            "wall_s": max(0.0, summary["wall_s"] - start), "wall_total_s": summary["wall_s"],
            "startup_s": timeline["startup_s"], "history": rows}


def run_counts(summary: dict[str, Any], run_dir: str | Path) -> dict[str, Any]:
    """fair_counts of a finished run in `run_dir` (its TensorBoard events, if any)."""
    return fair_counts(summary, read_timeline(run_dir))


def finished_summary(run_dir: str | Path, cfg) -> dict[str, Any] | None:
    """A bench run's summary.json if it finished with exactly `cfg` (then it is reused, not run again); None if it
    did not finish. A finished run made with another config (a different budget, override or preset) is an error:
    reusing it would silently mix settings in one table."""
    import json

    import yaml

    from acce.configlib import to_dict
    run_dir = Path(run_dir)
    done = run_dir / "summary.json"
    if not done.is_file():
        return None
    saved_path = run_dir / "config.yaml"
    saved = yaml.safe_load(saved_path.read_text()) if saved_path.is_file() else None
    wanted = yaml.safe_load(yaml.safe_dump(to_dict(cfg)))  # through YAML, as config.yaml was written
    if saved is not None:  # a field added to the config since the run was made, at its default: the same config
        _fill_added(saved, wanted, yaml.safe_load(yaml.safe_dump(to_dict(type(cfg)()))))
    if saved != wanted:
        diff = _differences(saved or {}, wanted)
        raise ValueError(f"{run_dir} finished with another config than this bench asks for "
                         f"({'; '.join(diff[:4]) or 'no config.yaml'}): pass another --workdir, or delete that run "
                         "to run it again")
    return json.loads(done.read_text())


def _fill_added(saved: dict, wanted: dict, default: dict) -> None:
    """Give `saved` the keys it lacks where `wanted` holds the code's default for them (in place, recursively)."""
    for key, value in wanted.items():
        if key not in saved:
            if key in default and default[key] == value:
                saved[key] = value
        elif isinstance(value, dict) and isinstance(saved[key], dict) and isinstance(default.get(key), dict):
            _fill_added(saved[key], value, default[key])


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, as 'key: old -> new'."""
    out = []
    for key in sorted(set(a) | set(b), key=str):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differences(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append(f"{prefix}{key}: {x!r} -> {y!r}")
    return out
