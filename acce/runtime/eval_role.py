"""EvaluatorRole: periodic evaluation as a runtime role (docs/design.md §1), beside the producers and the learner.

The driver submits a policy snapshot with its version and seed split; each `tick` runs at most one pending
evaluation with an Evaluator built for it (its own envs and deterministic server: acce/runtime/evaluator.py), and
`drain` hands back the finished ones, in submission order. Like every role it does not know where it runs: by default
the driver submits, ticks and drains in one go (train.py), so an evaluation pauses the loop; with `eval.background`
an EvalThread ticks it beside the loop, which keeps training (and drains what finished on its next turns). Version 0
and the final test evaluation always run in place.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class EvalRequest:
    """One evaluation waiting for a tick."""
    policy_state: dict[str, Any]
    """VLAPolicy.policy_state() snapshot (its tensors are copies, so later updates do not reach it)"""
    version: int
    """learner_version of that snapshot: the server's version and the TensorBoard step of its scalars"""
    split: str
    """seed split: 'val' (periodic; decides) or 'test' (version 0 and final; reports)"""
    video: bool = False
    """record one episode per task (Evaluator.run's video)"""
    context: dict[str, Any] = field(default_factory=dict)
    """the submitter's own notes, handed back with the result (the driver's env steps and wall-clock at submission)"""


@dataclass(frozen=True)
class EvalResult:
    """One finished evaluation, as drained."""
    version: int
    """learner_version of the evaluated policy"""
    split: str
    """seed split it ran on: 'val' or 'test'"""
    results: dict[str, Any]
    """Evaluator.run's dict, unchanged: per_task, videos, seed_split"""
    policy_state: dict[str, Any] = field(default_factory=dict)
    """the evaluated snapshot (train.select_on_val keeps the best one)"""
    context: dict[str, Any] = field(default_factory=dict)
    """EvalRequest.context, unchanged"""


class EvaluatorRole:
    """Role: runs submitted evaluations one per tick.

    make_evaluator(policy_state, version, split) builds what runs one evaluation (anything with Evaluator.run's
    signature): the caller decides the server, device and episode count per split; instructions: the paraphrase
    sets every evaluation reports (eval.instructions)."""

    def __init__(self, make_evaluator: Callable[[dict[str, Any], int, str], Any], *,
                 instructions: tuple[str, ...] = ("heldout",)):
        self.make_evaluator, self.instructions = make_evaluator, tuple(instructions)
        self.pending: deque[EvalRequest] = deque()
        """submitted and not yet run, oldest first"""
        self.finished: list[EvalResult] = []
        """run since the last drain, in submission order"""
        self._lock = threading.Lock()
        """guards pending / finished / _running when an EvalThread ticks while the driver submits and drains"""
        self._running = 0
        """evaluations taken off `pending` and not yet in `finished`"""

    @property
    def busy(self) -> bool:
        """an evaluation is pending or running (the driver waits for it before submitting the next)"""
        with self._lock:
            return bool(self.pending) or self._running > 0

    def submit(self, policy_state: dict[str, Any], version: int, split: str, video: bool = False,
               context: dict[str, Any] | None = None) -> None:
        """Queue one evaluation; a split that is not a seed split is refused here, before anything runs."""
        from acce.wiring import SEED_SPLIT_STARTS  # (light: acce.wiring imports sim/ only inside its factories)
        if split not in SEED_SPLIT_STARTS:
            raise ValueError(f"split must be one of {list(SEED_SPLIT_STARTS)}, got {split!r}")
        with self._lock:
            self.pending.append(EvalRequest(policy_state, int(version), split, bool(video), dict(context or {})))

    def tick(self) -> bool:
        """Run the oldest pending evaluation; False when none was pending."""
        with self._lock:
            if not self.pending:
                return False
            req = self.pending.popleft()
            self._running += 1
        try:
            ev = self.make_evaluator(req.policy_state, req.version, req.split)
            results = ev.run(req.split, instructions=self.instructions, video=req.video)
            with self._lock:
                self.finished.append(EvalResult(req.version, req.split, results, req.policy_state, req.context))
        finally:
            with self._lock:
                self._running -= 1
        return True

    def drain(self) -> tuple[EvalResult, ...]:
        with self._lock:
            done, self.finished = tuple(self.finished), []
        return done

    def state(self) -> dict[str, Any]:
        return {}  # pending evaluations are not checkpointed: the driver re-evaluates on its own schedule


class EvalThread:
    """Placement: ticks an EvaluatorRole on a daemon thread, so the driver's loop keeps training while it evaluates
    (`eval.background`). An evaluation that raises stops the thread; the error is raised again in the driver at its
    next `check` / `wait_idle`, never swallowed."""

    def __init__(self, role: EvaluatorRole, *, idle_sleep_s: float = 0.05):
        self.role, self.idle_sleep_s = role, idle_sleep_s
        self._stop, self.error = threading.Event(), None
        self._thread = threading.Thread(target=self._loop, name="acce-evaluator", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.role.tick():
                    self._stop.wait(self.idle_sleep_s)
        except BaseException as e:  # handed to the driver by check()
            self.error = e

    def check(self) -> None:
        """Raise (in the caller's thread) what stopped the evaluation thread, if anything did."""
        if self.error is not None:
            raise RuntimeError(f"background evaluation failed: {self.error!r}") from self.error

    def wait_idle(self, timeout_s: float = 3600.0) -> None:
        """Block until nothing is pending or running (the loop's end waits for the last periodic evaluation)."""
        import time
        deadline = time.monotonic() + timeout_s
        while self.role.busy and self.error is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"background evaluation still busy after {timeout_s:.0f} s")
            time.sleep(self.idle_sleep_s)
        self.check()

    def close(self, timeout_s: float | None = None) -> None:
        """Stop ticking and join the thread (a running evaluation finishes first, or the wait ends after
        timeout_s: the thread is a daemon and dies with the process)."""
        self._stop.set()
        self._thread.join(timeout_s)
