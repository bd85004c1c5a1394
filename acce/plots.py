"""Learning curves people would rather see than read: success vs wall-clock and vs env steps (PNG)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_learning_curve(curve: list[dict[str, Any]], evals: list[dict[str, Any]], tasks, path: str | Path,
                        title: str = "") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, x_key, label in ((axes[0], "wall_s", "wall-clock (s, RL phase)"), (axes[1], "env_steps", "env steps")):
        for i, task in enumerate(tasks):
            color = f"C{i}"
            pts = [(c[x_key], c[f"train/{task}"]) for c in curve if f"train/{task}" in c]
            if pts:
                ax.plot(*zip(*pts), color=color, alpha=0.6, label=f"{task}: training episodes (rolling)")
            key = f"eval/success/{task}/val"
            ev = [(e[x_key], e[key]) for e in evals if e.get("split", "val") == "val" and key in e]
            if ev:
                ax.plot(*zip(*ev), "o-", color=color, label=f"{task}: eval, validation seeds")
            key = f"eval/success/{task}/test"
            test = [(e[x_key], e[key]) for e in evals if e.get("split") == "test" and key in e]
            if test:  # version 0 and final: the reported numbers
                ax.plot(*zip(*test), "s", color=color, markersize=9, markerfacecolor="none",
                        label=f"{task}: test seeds (version 0, final)")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle(title)
    return _save(fig, path)


def plot_per_task(tasks, draw, path: str | Path, xlabel: str,
                  ylabel: str = "held-out success (test seeds)") -> Path:
    """One panel per task side by side (shared y axis); `draw(ax, task)` draws a panel's lines. Benchmark plots."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), sharey=True, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        draw(ax, task)
        ax.set_title(task)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
