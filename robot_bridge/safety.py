"""The safety envelope: the last thing every action passes before the robot, whatever produced it.

Order, each step: e-stop (latched) -> watchdog (no fresh policy reply within `timeout_s`) -> nothing to execute
-> NaN/inf rejection -> action bounds -> per-step rate limit -> workspace box. The first three replace the action
with the *hold* action; the others clamp it. Every intervention is counted, logged and returned as an event, and
the step is marked not-sampled when the executed action differs from the policy's by more than
`sampled_tolerance` (docs/design.md §5 rule 4: such steps give rewards and values but no policy-gradient term).

Hold: for delta-commanded dims (the tabletop's fingertip motion) hold means 0 = "stay where you are"; dims in
`hold_keep_dims` (a gripper, commanded absolutely) keep their last executed value, so holding never drops an object.
For absolute position control set `hold_keep_dims` to every dim.

Rate limits: without `max_rate`, the limits derived from the policy's training data (acce/action_rates.py, which
`acce serve` advertises as metadata "action_rates") apply, unless `max_rate_from_data` is false (`with_data_rates`).

Workspace box: with a delta end-effector action, the commanded fingertip target is tip + a[xyz] * max_step_m,
where tip comes from the observed state. The action is clamped so that target stays inside [low, high].
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np

from acce.action_rates import ActionRates
from acce.types import EnvSpec

logger = logging.getLogger(__name__)

EVENT_KINDS = ("estop", "watchdog", "hold", "nonfinite", "bounds", "rate", "workspace")
"""intervention kinds, in the order they are checked"""


@dataclass(frozen=True)
class SafetyConfig:
    """Limits applied to every action (normalized units unless a field says otherwise)."""

    action_low: tuple[float, ...] = ()
    """per-dim lower bound of the executed action; () = -1 for every dim"""
    action_high: tuple[float, ...] = ()
    """per-dim upper bound; () = +1 for every dim"""
    max_rate: tuple[float, ...] = ()
    """per-dim largest change from the previous executed action in one step; () = the limits derived from the
    policy's training data when its server advertises them (max_rate_from_data), else no rate limit"""
    max_rate_from_data: bool = True
    """without max_rate, limit each dim's rate to what the policy's training data did (acce/action_rates.py: a high
    percentile of the recorded per-step change times a margin, advertised by acce serve); false = no default limit"""
    timeout_s: float = 1.0
    """watchdog: hold when no policy reply arrived for this long (must exceed execution horizon / control_hz plus
    the slowest expected reply)"""
    hold_keep_dims: tuple[int, ...] = ()
    """dims that keep their last executed value while holding (absolute commands such as a gripper)"""
    workspace_low: tuple[float, ...] = ()
    """(3,) lower corner of the fingertip workspace box in metres; () = no box"""
    workspace_high: tuple[float, ...] = ()
    """(3,) upper corner of the box"""
    tip_state_dims: tuple[int, ...] = (0, 1, 2)
    """state dims holding the fingertip position (m), used by the workspace box"""
    tip_action_dims: tuple[int, ...] = (0, 1, 2)
    """action dims commanding fingertip motion (delta, in units of max_step_m)"""
    max_step_m: float = 0.0
    """fingertip displacement of an action of magnitude 1 (from the checkpoint's action_repr)"""
    sampled_tolerance: float = 1e-3
    """an executed action further than this from the sampled one marks the step policy_sampled=False"""
    units: str = "normalized"
    """what action_low, action_high and max_rate are measured in: "normalized" (the policy's [-1, 1]) or "spec"
    (the env spec's action units, e.g. a joint dataset's degrees: joint limits and degrees per step, converted with
    the spec's action_low / action_high). Without bounds a spec in data units still limits every dim to the range
    the dataset recorded, since [-1, 1] is that range"""

    def __post_init__(self) -> None:
        if len(self.action_low) != len(self.action_high):
            raise ValueError("action_low and action_high must have the same length (or both be empty)")
        if any(lo > hi for lo, hi in zip(self.action_low, self.action_high)):
            raise ValueError(f"action_low {self.action_low} must be <= action_high {self.action_high}")
        if any(r <= 0 for r in self.max_rate):
            raise ValueError(f"max_rate {self.max_rate} must be positive (use () for no limit)")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s} must be > 0")
        if self.units not in ("normalized", "spec"):
            raise ValueError(f"safety units={self.units!r} must be 'normalized' or 'spec'")
        if bool(self.workspace_low) != bool(self.workspace_high):
            raise ValueError("give both workspace_low and workspace_high (or neither)")
        if self.workspace_low:
            if not len(self.workspace_low) == len(self.workspace_high) == len(self.tip_state_dims) == len(
                    self.tip_action_dims):
                raise ValueError("workspace_low/high, tip_state_dims and tip_action_dims must have equal lengths")
            if not self.max_step_m > 0:
                raise ValueError("the workspace box needs max_step_m > 0 (the checkpoint's action_repr has it)")
            if any(lo >= hi for lo, hi in zip(self.workspace_low, self.workspace_high)):
                raise ValueError(f"workspace_low {self.workspace_low} must be < workspace_high {self.workspace_high}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SafetyConfig":
        """From JSON/YAML (lists become tuples); unknown keys are an error naming the valid ones."""
        from acce.configlib import dataclass_from_dict
        return dataclass_from_dict(cls, d, "safety")


def with_data_rates(config: SafetyConfig, rates: Mapping[str, Any] | None, spec: EnvSpec) -> tuple[SafetyConfig, str]:
    """(config, one line for the operator): the config with the data-derived limits (a server's metadata
    "action_rates", for the policy's env spec) as its max_rate when it sets none and max_rate_from_data; the line
    names the limits in force and their source ("" when the policy's server advertises none)."""
    if not rates:
        return config, ""
    try:
        r = ActionRates.from_dict(rates)
        if len(r.max_rate) != spec.action_dim or len(r.max_rate_units) not in (0, spec.action_dim):
            raise ValueError(f"{len(r.max_rate)} limits for {spec.action_dim} action dims")
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"the policy server's metadata has malformed action_rates ({type(err).__name__}: {err}); "
                         "serve the checkpoint with this version of acce serve, or set safety.max_rate") from None
    names = spec.action_names
    unit = "data units" if config.units == "spec" else "normalized units"
    values = r.values(config.units)
    if config.max_rate:
        return config, f"rate limits: safety.max_rate {_fmt(config.max_rate, names)} ({unit} per step); the training " \
                       "data's limits are not used"
    if not config.max_rate_from_data:
        return config, "rate limits: none (safety.max_rate_from_data=false)"
    if not values:  # units=spec on a spec without units: the envelope refuses that config with its own error
        return config, ""
    return replace(config, max_rate=values), (
        f"rate limits from the training data: {_fmt(values, names)} ({unit} per step; {r.margin:g} x the "
        f"{r.percentile:g}th percentile of the per-step change over {r.episodes} episodes of {r.source}); "
        "safety.max_rate overrides them, safety.max_rate_from_data=false turns them off")


def _fmt(values: tuple[float, ...], names: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"{n} {v:.3g}" if n else f"{v:.3g}" for n, v in zip(names or ("",) * len(values),
                                                                               values)) + "]"


@dataclass
class SafetyResult:
    action: np.ndarray
    """(A,) float32, what is sent to the robot"""
    sampled: bool
    """the executed action is (within tolerance) what the policy produced"""
    events: list[dict[str, Any]] = field(default_factory=list)
    hold: bool = False
    """the action is the hold action (e-stop, watchdog, nothing to execute, rejected)"""


class SafetyEnvelope:
    """Stateful filter for one robot: remembers the last executed action (rate limit, hold) and the e-stop latch."""

    def __init__(self, config: SafetyConfig, action_dim: int, estop_hook: Callable[[], bool] | None = None,
                 spec: EnvSpec | None = None):
        """spec: the policy's env spec; needed for units="spec" (its action_low / action_high convert the limits)."""
        self.config, self.A = config, int(action_dim)
        c = config
        for name in ("action_low", "action_high", "max_rate"):
            if getattr(c, name) and len(getattr(c, name)) != self.A:
                raise ValueError(f"safety {name} has {len(getattr(c, name))} dims, the robot's action has {self.A}")
        if any(not 0 <= i < self.A for i in c.hold_keep_dims + (c.tip_action_dims if c.workspace_low else ())):
            raise ValueError(f"safety dims must be in [0, {self.A})")
        low, high = np.asarray(c.action_low or [-1.0] * self.A), np.asarray(c.action_high or [1.0] * self.A)
        rate = np.asarray(c.max_rate, np.float64) if c.max_rate else None
        if c.units == "spec":
            if spec is None or not spec.action_low:
                raise ValueError("safety units=spec gives limits in the data's units, but the policy's env spec has "
                                 "none (no action_low / action_high): give them in [-1, 1] with units=normalized")
            span = np.asarray(spec.action_high) - np.asarray(spec.action_low)
            low = spec.from_units(low) if c.action_low else low  # joint limits (data units) -> normalized
            high = spec.from_units(high) if c.action_high else high
            rate = rate * 2.0 / span if rate is not None else None  # units per step -> normalized per step
        self.low, self.high = low.astype(np.float32), high.astype(np.float32)
        self.rate = rate.astype(np.float32) if rate is not None else None
        self.estop_hook = estop_hook
        self.counts = {k: 0 for k in EVENT_KINDS}
        self._estop = threading.Event()
        self.estop_reason = ""
        self.reset()

    def reset(self, last_action: np.ndarray | None = None) -> None:
        """New episode: forget the previous action (holding then means all zeros unless one is given)."""
        self.last = np.zeros(self.A, np.float32) if last_action is None else np.asarray(last_action, np.float32)

    # --- e-stop ----------------------------------------------------------------------------------------------
    def trigger_estop(self, reason: str = "e-stop") -> None:
        """Latch the e-stop (thread-safe; call from a signal handler, a button poller, a UI)."""
        if not self._estop.is_set():
            self.estop_reason = reason
            self._estop.set()
            logger.warning("E-STOP: %s", reason)

    @property
    def estopped(self) -> bool:
        if not self._estop.is_set() and self.estop_hook is not None and self.estop_hook():
            self.trigger_estop("estop hook")
        return self._estop.is_set()

    def hold_action(self) -> np.ndarray:
        hold = np.zeros(self.A, np.float32)
        keep = list(self.config.hold_keep_dims)
        hold[keep] = self.last[keep]
        return hold

    # --- the filter ------------------------------------------------------------------------------------------
    def apply(self, action: np.ndarray | None, state: np.ndarray | None, *, fresh: bool = True,
              t: int = 0) -> SafetyResult:
        """action: the executor's (A,) action or None (nothing to execute); state: the observed state (S,);
        fresh: a policy reply arrived within timeout_s."""
        c, events = self.config, []

        def event(kind: str, detail: str) -> None:
            self.counts[kind] += 1
            events.append({"t": t, "kind": kind, "detail": detail})
            log = logger.warning if kind in ("estop", "watchdog", "nonfinite") else logger.info
            log("safety %s at step %d: %s", kind, t, detail)

        if self.estopped:
            return self._hold(events, event, "estop", self.estop_reason)
        if not fresh:
            return self._hold(events, event, "watchdog", f"no policy reply for more than {c.timeout_s} s")
        if action is None:
            return self._hold(events, event, "hold", "no chunk to execute (waiting for the first reply, or the "
                                                     "chunk ran out)")
        sampled = np.asarray(action, np.float32).reshape(-1)
        if sampled.shape != (self.A,):
            return self._hold(events, event, "nonfinite", f"action shape {sampled.shape}, expected ({self.A},)")
        if not np.all(np.isfinite(sampled)):
            return self._hold(events, event, "nonfinite", f"action {sampled.tolist()} has NaN/inf")
        out = sampled.copy()
        clipped = np.clip(out, self.low, self.high)
        if not np.array_equal(clipped, out):
            event("bounds", f"{out.tolist()} -> {clipped.tolist()}")
            out = clipped
        if self.rate is not None:
            limited = np.clip(out, self.last - self.rate, self.last + self.rate)
            if not np.array_equal(limited, out):
                event("rate", f"{out.tolist()} -> {limited.tolist()} (previous {self.last.tolist()})")
                out = limited
        if c.workspace_low and state is not None:
            out = self._workspace(out, np.asarray(state, np.float64), event)
        self.last = out.astype(np.float32)
        ok = float(np.max(np.abs(out - sampled), initial=0.0)) <= c.sampled_tolerance
        return SafetyResult(self.last.copy(), ok, events)

    def _hold(self, events, event, kind: str, detail: str) -> SafetyResult:
        event(kind, detail)
        self.last = self.hold_action()
        return SafetyResult(self.last.copy(), False, events, hold=True)

    def _workspace(self, out: np.ndarray, state: np.ndarray, event) -> np.ndarray:
        c = self.config
        tip = state[list(c.tip_state_dims)]
        dims = list(c.tip_action_dims)
        target = tip + out[dims].astype(np.float64) * c.max_step_m
        # A tip already outside the box (a bump, a bad calibration) may only move back toward it.
        low = np.minimum(np.asarray(c.workspace_low), tip)
        high = np.maximum(np.asarray(c.workspace_high), tip)
        inside = np.clip(target, low, high)
        if np.allclose(inside, target, atol=1e-9):
            return out
        new = out.copy()
        new[dims] = np.clip((inside - tip) / c.max_step_m, self.low[dims], self.high[dims]).astype(np.float32)
        event("workspace", f"target {np.round(target, 4).tolist()} outside the box -> action {new.tolist()}")
        return new
