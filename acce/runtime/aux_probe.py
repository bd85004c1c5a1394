"""Aux probe: does the policy's perception locate what the task is about, and at which point of an episode?

`acce eval --aux-probe` evaluates as usual, on envs that also carry the privileged aux labels (the named object's
table xy, then the goal's, in m; evaluation never gives them to the policy). At every decision it also reads the
policy's aux head and, per task, label and phase of the episode (control steps since reset), reports how much of the
label a straight-line read-out of that one head output explains (R²) and what error is left (cm). The read-out is
fitted on the probe's own decisions: it needs no scale from the checkpoint (older ones keep none; newer ones keep
cloning's as VLAPolicy.aux_norm) and measures what the head carries, not how well it is calibrated. RL on a
frozen encoder cannot correct what these features do not carry: this is the check to run before tuning a learner
on a task whose warm start fails.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping, Sequence

import numpy as np

from acce.types import AUX_KEY

AUX_LABELS = ("object x", "object y", "goal x", "goal y")
"""what obs["aux"]'s columns are (sim.task.AUX_DIM; tabletop and Meta-World alike)"""
PHASES = ((0, 1, "t = 0"), (1, 25, "t 1-24"), (25, 50, "t 25-49"), (50, 100, "t 50-99"), (100, None, "t >= 100"))
"""(first, end, name) control-step windows of an episode: the first frame, the approach, and later"""


def linear_readout(truth: np.ndarray, pred: np.ndarray) -> tuple[float, float]:
    """(R², residual rmse) of the least-squares line truth ≈ a·pred + b over the rows; R² = 1 − var(residual) / var(truth).
    A truth without spread has nothing to explain: R² is NaN there."""
    truth, pred = np.asarray(truth, np.float64), np.asarray(pred, np.float64)
    if truth.shape != pred.shape or truth.ndim != 1 or len(truth) == 0:
        raise ValueError(f"need two equal 1-d arrays with rows, got {truth.shape} and {pred.shape}")
    x = np.c_[pred, np.ones_like(pred)]
    coef, *_ = np.linalg.lstsq(x, truth, rcond=None)
    resid = truth - x @ coef
    var = truth.var()
    return (float(1.0 - resid.var() / var) if var > 0 else float("nan")), float(np.sqrt(np.mean(resid ** 2)))


class AuxProbe:
    """The Evaluator's `probe` hook: called with (task, control step of each deciding env, the envs' observation
    batch, the policy request) at every decision; keeps (step, label, head output) rows per task."""

    def __init__(self, policy) -> None:
        if not getattr(policy, "aux_dim", 0):
            raise ValueError("this policy has no aux head (aux_dim = 0): nothing to probe. Clone the warm start with "
                             "bc.aux_loss_coef > 0 to give it one")
        self.policy = policy
        self.rows: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = defaultdict(list)

    def __call__(self, task: str, steps: Sequence[int], batch: Mapping[str, Any], request: Mapping[str, Any]) -> None:
        import torch

        if AUX_KEY not in batch:
            raise ValueError("the evaluation envs give no aux labels: build the Evaluator with aux_labels=True")
        with torch.inference_mode():  # a second forward pass, so the serving path stays as it is for a diagnostic
            pred = self.policy.forward(self.policy.with_lang(request), return_aux=True)[3]
        self.rows[task].append((np.asarray(steps, np.int64), np.asarray(batch[AUX_KEY], np.float64),
                                pred.float().cpu().numpy().astype(np.float64)))

    def report(self) -> dict[str, Any]:
        """{task: {label: {phase: {"r2": x, "rmse_cm": x, "n": rows}}}}; a phase with fewer than 3 decisions is left out."""
        out: dict[str, Any] = {}
        for task, chunks in self.rows.items():
            steps = np.concatenate([c[0] for c in chunks])
            truth, pred = np.concatenate([c[1] for c in chunks]), np.concatenate([c[2] for c in chunks])
            cells: dict[str, Any] = {}
            for j in range(min(truth.shape[1], pred.shape[1])):
                label = AUX_LABELS[j] if j < len(AUX_LABELS) else f"aux[{j}]"
                cells[label] = {}
                for first, end, name in (*PHASES, (0, None, "all")):
                    sel = (steps >= first) & (steps < (end if end is not None else np.iinfo(np.int64).max))
                    if sel.sum() < 3:
                        continue
                    r2, rmse = linear_readout(truth[sel, j], pred[sel, j])
                    cells[label][name] = {"r2": r2, "rmse_cm": 100.0 * rmse, "n": int(sel.sum())}
            out[task] = cells
        return out


def format_probe(report: Mapping[str, Any]) -> str:
    """One block per task: a row per label, a column per phase, `R² (rmse cm)`."""
    names = [p[2] for p in PHASES] + ["all"]
    lines = []
    for task, cells in report.items():
        lines.append(f"aux probe {task}: R² of a linear read-out of the aux head (residual error, cm)")
        lines.append(f"  {'label':10s}" + "".join(f"{n:>18s}" for n in names))
        for label, phases in cells.items():
            row = "".join(f"{phases[n]['r2']:>9.2f} ({phases[n]['rmse_cm']:4.1f})" if n in phases else f"{'-':>18s}"
                          for n in names)
            lines.append(f"  {label:10s}{row}")
        lines.append("  n per phase: " + ", ".join(f"{n} {next(iter(cells.values())).get(n, {}).get('n', 0)}"
                                                     for n in names) if cells else "  (no decisions)")
    return "\n".join(lines)
