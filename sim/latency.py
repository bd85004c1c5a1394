"""Inference-latency models: how many control steps a policy request takes (docs/design.md §5).

Every model implements `acce.types.LatencyModel` (`sample_steps() -> int`) and also `sample_latency_s() -> float`
(the latency in seconds, for logging as `delay/*`). The conversion is

    d = ceil(latency_s * control_hz)

so a request that takes 0.25 s at 10 Hz occupies 3 control steps, and a zero-latency request occupies none.

Models:
  - `FixedLatency(steps, control_hz)`, or `FixedLatency.from_seconds(latency_s, control_hz)`: always the same d.
  - `UniformLatency(low_s, high_s, control_hz, seed)`: latency_s ~ U[low_s, high_s].
  - `EmpiricalLatency(latencies_s, control_hz, seed)`: bootstrap (sampling with replacement) from measured
    latencies, e.g. the ones robot_bridge records on a real robot; `EmpiricalLatency.from_file(path, ...)`.

Latency file formats accepted by `EmpiricalLatency.from_file` (latencies always in SECONDS):
  - JSON (what the robot runtime writes), recognised by a `.json` suffix or a leading `{`:
        {"latency_s": [0.081, 0.094, 0.077, ...], "control_hz": 10.0, "source": "robot_bridge", ...}
    `latency_s` is required; every other key is metadata and ignored here.
  - Plain text: one float per line; blank lines and lines starting with `#` are ignored.
Every value must be finite and >= 0, and there must be at least one.

All randomness comes from a seeded `numpy.random.Generator`, so a model built with the same seed yields the same
sequence of draws (`sample_steps` and `sample_latency_s` share that generator). `spawn(key)` gives a model of the
same law for a parallel user (an evaluation's env group) with its own generator derived from the seed and key.
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np

LATENCY_KINDS = ("fixed", "uniform", "empirical")
"""valid `kind` values of `make_latency_model`"""

_CEIL_EPS = 1e-9
"""slack (in control steps) subtracted before ceil. Why: latency_s * control_hz is computed in binary floating
point, e.g. 0.3 * 10 == 3.0000000000000004, and a bare ceil would turn an exact 3-step latency into 4 steps.
1e-9 steps is far below any measurable latency (1 ns at 1 Hz) but far above float64 rounding error (~1e-15
relative) for any realistic step count."""


def latency_to_steps(latency_s: float | np.ndarray, control_hz: float) -> int | np.ndarray:
    """d = ceil(latency_s * control_hz), robust to float rounding; scalar in -> int out, array in -> int64 array."""
    _check_control_hz(control_hz)
    arr = np.asarray(latency_s, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"latency_s must be finite and >= 0 seconds, got {latency_s!r}")
    steps = np.maximum(np.ceil(arr * control_hz - _CEIL_EPS), 0).astype(np.int64)
    return int(steps) if steps.ndim == 0 else steps


def _check_control_hz(control_hz: float) -> None:
    if not (isinstance(control_hz, (int, float, np.integer, np.floating)) and math.isfinite(control_hz)
            and control_hz > 0):
        raise ValueError(f"control_hz must be a finite number > 0, got {control_hz!r}")


def _check_latency_s(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite latency >= 0 seconds, got {value!r}")
    return value


def _child_rng(rng: np.random.Generator, key: int) -> np.random.Generator:
    """A generator derived from rng's seed and key (SeedSequence spawn keys): the same key always gives the same
    draws, different keys independent ones, and the parent's own draws are untouched."""
    seq = rng.bit_generator.seed_seq
    return np.random.default_rng(np.random.SeedSequence(seq.entropy, spawn_key=(*seq.spawn_key, int(key))))


class FixedLatency:
    """Every request takes exactly `steps` control steps (d = 0 is the no-latency baseline)."""

    def __init__(self, steps: int, control_hz: float | None = None):
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ValueError(f"FixedLatency steps must be an integer >= 0, got {steps!r}")
        if control_hz is not None:
            _check_control_hz(control_hz)
        self.steps = int(steps)
        self.control_hz = None if control_hz is None else float(control_hz)
        # Why steps / hz: it is the largest latency that still maps back to `steps` (ceil is exact there).
        self.latency_s = None if control_hz is None else self.steps / self.control_hz

    @classmethod
    def from_seconds(cls, latency_s: float, control_hz: float) -> "FixedLatency":
        """A fixed latency given in seconds; sample_latency_s() returns exactly `latency_s`."""
        latency_s = _check_latency_s("latency_s", latency_s)
        model = cls(latency_to_steps(latency_s, control_hz), control_hz)
        model.latency_s = latency_s
        return model

    @property
    def max_steps(self) -> int:
        """largest d this model can return (sizes the committed-prefix buffer)"""
        return self.steps

    def sample_steps(self) -> int:
        return self.steps

    def spawn(self, key: int) -> "FixedLatency":
        """Stateless: parallel users can share this model."""
        return self

    def sample_latency_s(self) -> float:
        if self.latency_s is None:
            raise ValueError("FixedLatency(steps) has no latency in seconds: pass control_hz to convert")
        return self.latency_s

    def __repr__(self) -> str:
        return f"FixedLatency(steps={self.steps}, control_hz={self.control_hz})"


class UniformLatency:
    """latency_s ~ U[low_s, high_s] per request; d = ceil(latency_s * control_hz)."""

    def __init__(self, low_s: float, high_s: float, control_hz: float, seed: int | None = None):
        low_s = _check_latency_s("low_s", low_s)
        high_s = _check_latency_s("high_s", high_s)
        if low_s > high_s:
            raise ValueError(f"UniformLatency needs low_s <= high_s, got low_s={low_s} > high_s={high_s}: swap them")
        _check_control_hz(control_hz)
        self.low_s, self.high_s, self.control_hz = low_s, high_s, float(control_hz)
        self._rng = np.random.default_rng(seed)

    @property
    def max_steps(self) -> int:
        """largest d this model can return (sizes the committed-prefix buffer)"""
        return latency_to_steps(self.high_s, self.control_hz)

    def sample_latency_s(self) -> float:
        return float(self._rng.uniform(self.low_s, self.high_s))

    def sample_steps(self) -> int:
        return latency_to_steps(self.sample_latency_s(), self.control_hz)

    def spawn(self, key: int) -> "UniformLatency":
        """The same law with its own generator (derived from this one's seed and key): one per parallel user, so no
        draw depends on which thread asks first."""
        child = UniformLatency(self.low_s, self.high_s, self.control_hz)
        child._rng = _child_rng(self._rng, key)
        return child

    def __repr__(self) -> str:
        return f"UniformLatency(low_s={self.low_s}, high_s={self.high_s}, control_hz={self.control_hz})"


class EmpiricalLatency:
    """Bootstrap from measured latencies: each request draws one recorded value uniformly with replacement.

    Why bootstrap rather than a fitted parametric law: real inference latency is multi-modal (batching, GC,
    network retries) and its tail is what hurts; resampling the measurements keeps that shape exactly.
    """

    def __init__(self, latencies_s: Sequence[float] | np.ndarray, control_hz: float, seed: int | None = None):
        values = np.asarray(latencies_s, dtype=np.float64).reshape(-1)
        if values.size == 0:
            raise ValueError("EmpiricalLatency needs at least one measured latency, got none")
        bad = ~np.isfinite(values) | (values < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"measured latencies must be finite and >= 0 seconds; value #{i} is {values[i]!r} "
                             f"({int(bad.sum())} bad of {values.size}): fix or drop those entries")
        _check_control_hz(control_hz)
        self.latencies_s = values
        self.control_hz = float(control_hz)
        self._steps = latency_to_steps(values, self.control_hz)  # (n,) int64, precomputed once
        self._rng = np.random.default_rng(seed)

    @classmethod
    def from_file(cls, path: str | Path, control_hz: float, seed: int | None = None) -> "EmpiricalLatency":
        """Load measured latencies (seconds) from a JSON or plain-text file; see the module docstring."""
        return cls(read_latency_file(path), control_hz, seed)

    @property
    def max_steps(self) -> int:
        """largest d this model can return (sizes the committed-prefix buffer)"""
        return int(self._steps.max())

    def _draw_index(self) -> int:
        return int(self._rng.integers(self.latencies_s.size))

    def sample_latency_s(self) -> float:
        return float(self.latencies_s[self._draw_index()])

    def sample_steps(self) -> int:
        return int(self._steps[self._draw_index()])

    def spawn(self, key: int) -> "EmpiricalLatency":
        """The same measurements with their own generator (derived from this one's seed and key); see UniformLatency."""
        child = copy.copy(self)
        child._rng = _child_rng(self._rng, key)
        return child

    def __repr__(self) -> str:
        return (f"EmpiricalLatency(n={self.latencies_s.size}, median_s={np.median(self.latencies_s):.4g}, "
                f"control_hz={self.control_hz})")


def read_latency_file(path: str | Path) -> np.ndarray:
    """Measured latencies in seconds from `path` (JSON `{"latency_s": [...]}` or one float per line).

    Only parses; value checks (finite, >= 0, non-empty) happen in `EmpiricalLatency`.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"latency file {str(path)!r} does not exist: record one with robot_bridge or fix the path")
    text = path.read_text()
    if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"latency file {str(path)!r} is not valid JSON ({e})") from None
        if not isinstance(data, dict) or "latency_s" not in data:
            raise ValueError(f"latency file {str(path)!r} must be a JSON object with a 'latency_s' list of seconds, "
                             f"e.g. {{\"latency_s\": [0.08, 0.09]}}")
        raw = data["latency_s"]
        if not isinstance(raw, list):
            raise ValueError(f"'latency_s' in {str(path)!r} must be a list of numbers, got {type(raw).__name__}")
        try:
            return np.asarray([float(v) for v in raw], dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"'latency_s' in {str(path)!r} must hold only numbers (seconds)") from None
    values = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            values.append(float(line))
        except ValueError:
            raise ValueError(f"{str(path)!r} line {lineno}: expected one latency in seconds per line, "
                             f"got {line!r}") from None
    return np.asarray(values, dtype=np.float64)


def make_latency_model(kind: str, *, control_hz: float, seed: int | None, fixed_steps: int = 0,
                       low_s: float = 0.0, high_s: float = 0.0, path: str | Path | None = None):
    """Build a latency model from config values.

    kind: "fixed" (uses fixed_steps), "uniform" (low_s, high_s) or "empirical" (path to a latency file).
    """
    if kind == "fixed":
        return FixedLatency(fixed_steps, control_hz)
    if kind == "uniform":
        return UniformLatency(low_s, high_s, control_hz, seed)
    if kind == "empirical":
        if path is None:
            raise ValueError("latency kind 'empirical' needs path= to a latency file (JSON {\"latency_s\": [...]} "
                             "or one float per line)")
        return EmpiricalLatency.from_file(path, control_hz, seed)
    raise ValueError(f"unknown latency kind {kind!r}; valid kinds: {', '.join(LATENCY_KINDS)}")
