"""Per-dim action rate limits derived from recorded data: the safety envelope's default `max_rate` (docs/robot.md §5).

A policy cloned from a robot's own teleoperation should not command a joint faster than the operator ever moved it.
Per action dim the limit is `margin` x the `percentile`-th percentile of |a_t - a_(t-1)| over consecutive steps
within each episode (`dataset.max_rate_percentile`, `dataset.max_rate_margin`), in the policy's [-1, 1] units and,
when the env spec records the data's units, in those (degrees per step for an SO-101).

Where the figures live (EnvSpec stays as it is): the import records them in the episode store's root attrs
(`action_rates`, beside the schema, not in it: two imports of one robot into one store must not differ in schema);
`acce serve` finds the store of the checkpoint's run (`checkpoint_action_rates`) and advertises them in its
metadata frame; `acce robot` uses them when the safety config sets no `max_rate` (robot_bridge.safety).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from acce.data_kind import data_kind
from acce.types import EnvSpec

ATTR = "action_rates"
"""the episode store's root attr holding the recorded figures"""
MIN_RATE = 0.01
"""floor of a derived limit in [-1, 1] units per step (0.5 % of the dim's range): a dim the data never moved must
still be able to settle, and a limit of 0 is no valid limit"""


@dataclass(frozen=True)
class ActionRates:
    """Data-derived per-dim rate limits and where they came from."""

    max_rate: tuple[float, ...]
    """(A,) largest change per control step in the policy's [-1, 1] units"""
    max_rate_units: tuple[float, ...]
    """(A,) the same in the data's units (the env spec's action_low/high); () when the spec records no units"""
    percentile: float
    """percentile of the recorded per-step changes the limits start from"""
    margin: float
    """factor on that percentile"""
    episodes: int
    """episodes the changes were measured on"""
    steps: int
    """per-step changes measured (per dim)"""
    source: str
    """the store (or dataset) the figures were measured on"""

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ActionRates":
        return cls(tuple(float(v) for v in d["max_rate"]), tuple(float(v) for v in d.get("max_rate_units") or ()),
                   float(d["percentile"]), float(d["margin"]), int(d["episodes"]), int(d["steps"]),
                   str(d.get("source", "")))

    def values(self, units: str) -> tuple[float, ...]:
        """The limits in a SafetyConfig's units ("normalized" or "spec"); () when the data has no such units."""
        return self.max_rate_units if units == "spec" else self.max_rate


def action_rates(actions: Sequence[np.ndarray], units: tuple[Sequence[float], Sequence[float]], percentile: float,
                 margin: float, source: str) -> ActionRates | None:
    """Limits from per-episode (T, A) actions in [-1, 1], whose units (action_low, action_high) are those of the
    env spec or store schema (empty: none); None when no episode has two steps."""
    diffs = [np.abs(np.diff(np.asarray(a, np.float64), axis=0)) for a in actions if len(a) >= 2]
    if not diffs:
        return None
    d = np.concatenate(diffs)
    rate = np.maximum(np.percentile(d, percentile, axis=0) * margin, MIN_RATE)
    low, high = units
    in_units = tuple((rate * (np.asarray(high) - np.asarray(low)) / 2.0).tolist()) if len(low) else ()
    return ActionRates(tuple(rate.tolist()), in_units, float(percentile), float(margin), len(diffs), len(d), source)


def store_action_rates(store, percentile: float, margin: float) -> ActionRates | None:
    """Limits of an episode store's actions: the recorded figures when they were measured on every episode with
    these settings, else measured now (only the action column is read)."""
    recorded = recorded_action_rates(store)
    if recorded is not None and (recorded.percentile, recorded.margin) == (percentile, margin):
        return recorded
    actions = store.frames("action")
    per_episode = []
    for i in range(len(store)):
        start, stop = store.frame_range(i)
        per_episode.append(actions[start:stop - 1])  # row T is the final observation's padding
    schema = store.schema  # not its env_spec: a store of non-square images has none, but its actions have limits
    return action_rates(per_episode, (schema.action_low, schema.action_high), percentile, margin, str(store.path))


def record_action_rates(store, rates: ActionRates | None) -> None:
    """Write (or, with None, remove) the figures in the store's root attrs; the store object sees them."""
    import zarr
    root = zarr.open_group(store.path, mode="r+")
    attrs = {k: v for k, v in root.attrs.asdict().items() if k != ATTR}
    root.attrs.put({**attrs, **({ATTR: {**rates.to_dict(), "num_episodes": len(store)}} if rates else {})})
    store.refresh()


def recorded_action_rates(store) -> ActionRates | None:
    """The figures the store records, if they cover all its episodes (a later append makes them stale)."""
    import zarr
    d = zarr.open_group(store.path, mode="r").attrs.asdict().get(ATTR)
    if not d or int(d.get("num_episodes", -1)) != len(store):
        return None
    return ActionRates.from_dict(d)


def checkpoint_action_rates(data: Mapping[str, Any], path: str | Path,
                            spec: EnvSpec) -> tuple[ActionRates | None, str]:
    """(figures, why none) for a checkpoint file at `path`: its own `action_rates` entry, else the episode store of
    its run when it was trained on a dataset (`acce train --data`: the dataset itself when it is an acce store, else
    the run's demos.zarr import). The store must have the policy's action width and units."""
    from acce.store.episodes import EpisodeStore

    if data.get(ATTR):
        return ActionRates.from_dict(data[ATTR]), ""
    dataset = (data.get("config") or {}).get("dataset") or {}
    if not dataset.get("path"):
        return None, ""  # not trained on a dataset: nothing to derive limits from
    path = Path(path)
    candidates = [Path(dataset["path"]), path.parent.parent / "demos.zarr", path.parent / "demos.zarr"]
    found = next((c for c in candidates if data_kind(c) == "zarr"), None)
    if found is None:
        return None, (f"the checkpoint was trained on {dataset['path']} but no episode store of it is at "
                      f"{', '.join(str(c) for c in candidates[1:])}")
    try:
        store = EpisodeStore.open(found)
    except (OSError, ValueError) as err:  # StoreError is a ValueError: a damaged store must not stop serving
        return None, f"cannot read {found} ({type(err).__name__}: {err})"
    theirs = store.schema
    if (theirs.action_dim, theirs.action_low, theirs.action_high) != (spec.action_dim, spec.action_low,
                                                                     spec.action_high):
        return None, f"{found} holds actions of another width or range than the policy's"
    from acce.data_config import DatasetConfig  # checkpoints older than these fields: the defaults
    rates = store_action_rates(store, float(dataset.get("max_rate_percentile", DatasetConfig.max_rate_percentile)),
                               float(dataset.get("max_rate_margin", DatasetConfig.max_rate_margin)))
    return rates, "" if rates else f"{found} has no episode of two or more steps"
