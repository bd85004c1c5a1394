"""SourceMixer: one learner batch from two queues, simulator and imagined, by `imagination.imagined_fraction`.

Why two queues and not one: with one FIFO the imagined share of a batch would be whatever the producers happened
to deliver (fast imagination would crowd out the simulator); two bounded queues keep each source's pacing and
staleness gate separate, and the mixer fixes the composition: every batch takes n_sim = B − n_imagined simulator
segments (waiting for them, as the learner always has) and then up to n_imagined = round(fraction × B) imagined
segments that are already waiting. The learner never waits for imagination (the world model may not have been
published yet, or may be slow): a share the imagined queue cannot fill is taken from the simulator and counted
(`queue/imagined_shortfall`), and both staleness gates are told (`on_shortfall`), because their FIFO consumption
model assumed n_sim and n_imagined per batch. On Ray the mixer also drops an imagined segment that would be consumed
staler than learner.max_staleness (counted, `queue/imagined_dropped_stale`; its slot taken from the simulator): the
imagined gate admits by a FIFO model the learner does not follow for imagination, since it never waits for it.

Placement-agnostic: the runtime passes `get_sim(n)` (blocks; None when stopping) and `get_imagined(n)` (returns at
most n without waiting) over a local RolloutQueue or a Ray queue.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from acce.types import Segment

Take = Callable[[int], "list[Segment] | None"]


class SourceMixer:
    def __init__(self, batch_segments: int, n_imagined: int,
                 on_shortfall: Callable[[int], None] | None = None, max_staleness: int = -1,
                 on_stale: Callable[[int], None] | None = None):
        """max_staleness >= 0 (with `take(..., version=)`): an imagined segment that would be consumed staler than
        this is dropped, counted, and its slot filled from the simulator (on_stale(n): the simulator stream gave n
        more than its share; the imagined stream's were taken off its queue as its FIFO model assumes). Why: the
        learner does not wait for imagination, so an imagined segment is consumed when its production ends, which
        the imagined gate cannot bound when the learner updates faster than imagination produces."""
        if not 0 <= n_imagined < batch_segments:
            raise ValueError(f"n_imagined={n_imagined} must be in [0, batch_segments={batch_segments})")
        self.batch_segments, self.n_imagined = int(batch_segments), int(n_imagined)
        self.n_sim = self.batch_segments - self.n_imagined
        self.on_shortfall, self.on_stale, self.max_staleness = on_shortfall, on_stale, int(max_staleness)
        self.shortfall = 0
        """imagined slots filled with simulator segments so far"""
        self.dropped_stale = 0
        """imagined segments dropped as too stale to consume (their slots filled from the simulator)"""
        self.consumed = {"sim": 0, "imagined": 0}

    def sim_needed(self, imagined_waiting: int) -> int:
        """Simulator segments a batch needs when `imagined_waiting` imagined segments are queued (local runtime)."""
        return self.batch_segments - min(imagined_waiting, self.n_imagined)

    def take(self, get_sim: Take, get_imagined: Take, version: int | None = None) -> list[Segment] | None:
        """One batch: n_sim simulator segments, then the imagined share (or simulator segments where it is short, or
        where an imagined segment is too stale for the learner at `version`). None when `get_sim` reports that the
        runtime is stopping."""
        sim = get_sim(self.n_sim)
        if sim is None or len(sim) < self.n_sim:
            return None
        imagined = list(get_imagined(self.n_imagined) or []) if self.n_imagined else []
        if len(imagined) > self.n_imagined:
            raise RuntimeError(f"get_imagined returned {len(imagined)} segments for {self.n_imagined} slots")
        stale = 0
        if version is not None and self.max_staleness >= 0:
            fresh = [s for s in imagined if version - int(s.behavior_version.min()) <= self.max_staleness]
            stale, imagined = len(imagined) - len(fresh), fresh
        short = self.n_imagined - len(imagined) - stale
        if short + stale:
            extra = get_sim(short + stale)
            if extra is None or len(extra) < short + stale:
                return None
            sim = list(sim) + list(extra)
        if short:
            self.shortfall += short
            if self.on_shortfall is not None:
                self.on_shortfall(short)
        if stale:
            self.dropped_stale += stale
            if self.on_stale is not None:
                self.on_stale(stale)
        self.consumed["sim"] += len(sim)
        self.consumed["imagined"] += len(imagined)
        return list(sim) + imagined

    def metrics(self, batch: Sequence[Segment], learner_version: int) -> dict[str, float]:
        """Per-source view of a batch at consumption (before the update): composition, staleness, reward scale."""
        out = {"queue/imagined_frac": sum(s.source == "imagined" for s in batch) / max(len(batch), 1),
               "queue/imagined_shortfall": float(self.shortfall),
               "queue/imagined_dropped_stale": float(self.dropped_stale),
               "queue/consumed/sim": float(self.consumed["sim"]),
               "queue/consumed/imagined": float(self.consumed["imagined"])}
        for source in ("sim", "imagined"):
            segs = [s for s in batch if s.source == source]
            if segs:
                stale = np.concatenate([learner_version - s.behavior_version for s in segs])
                out[f"staleness/mean/{source}"] = float(stale.mean())
                out[f"learner/reward_mean/{source}"] = float(np.concatenate([s.reward for s in segs]).mean())
        imagined = [s for s in batch if s.source == "imagined"]
        if imagined:
            out["wm/consumed_version_mean"] = float(np.concatenate([s.wm_version for s in imagined]).mean())
        return out
