"""EvaluatorRole: periodic evaluation as a runtime role (docs/design.md §1), beside the producers and the learner.

The driver submits a policy snapshot with its version and seed split; each `tick` runs at most one pending
evaluation with an Evaluator built for it (its own envs and deterministic server: acce/runtime/evaluator.py), and
`drain` hands back the finished ones, in submission order. Like every role it does not know where it runs: today the
driver submits, ticks and drains in one go (train.py), so an evaluation still pauses the driver as before; a placement
may tick it on its own thread or process later without changing the contract.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
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


@dataclass(frozen=True)
class EvalResult:
    """One finished evaluation, as drained."""
    version: int
    """learner_version of the evaluated policy"""
    split: str
    """seed split it ran on: 'val' or 'test'"""
    results: dict[str, Any]
    """Evaluator.run's dict, unchanged: per_task, videos, seed_split"""


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

    def submit(self, policy_state: dict[str, Any], version: int, split: str, video: bool = False) -> None:
        """Queue one evaluation; a split that is not a seed split is refused here, before anything runs."""
        from acce.wiring import SEED_SPLIT_STARTS  # (light: acce.wiring imports sim/ only inside its factories)
        if split not in SEED_SPLIT_STARTS:
            raise ValueError(f"split must be one of {list(SEED_SPLIT_STARTS)}, got {split!r}")
        self.pending.append(EvalRequest(policy_state, int(version), split, bool(video)))

    def tick(self) -> bool:
        """Run the oldest pending evaluation; False when none was pending."""
        if not self.pending:
            return False
        req = self.pending.popleft()
        ev = self.make_evaluator(req.policy_state, req.version, req.split)
        results = ev.run(req.split, instructions=self.instructions, video=req.video)
        self.finished.append(EvalResult(req.version, req.split, results))
        return True

    def drain(self) -> tuple[EvalResult, ...]:
        done, self.finished = tuple(self.finished), []
        return done

    def state(self) -> dict[str, Any]:
        return {}  # pending evaluations are not checkpointed: the driver re-evaluates on its own schedule
