"""`acce bench merge`: one `bench rl` result from several `acce bench rl` runs over different tasks.

A bench rl over every task at once is hours of 2-core time, so the runs are made task by task (each with its own
warm start, --task-overrides and budget) and merged into the one file the issue's schema describes. Each task keeps
where it came from (input file, date, CPU model, budget, seeds, warm start, counting), and the tables and headline
are recomputed from the recorded runs. Every per-task async / sync comparison was measured inside one bench run
(modes alternating per seed), so merging runs of different days changes only how tasks are weighted in the summed
headline ratio, never a task's own ratio.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from acce.bench.headline import OLD_COUNTING, rl_headline, write_doc


def _read(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--in {path}: no such file")
    doc = json.loads(p.read_text())
    result = doc.get("result")
    if doc.get("bench") != "rl" or not isinstance(result, dict) or not isinstance(result.get("runs"), dict):
        raise ValueError(f"--in {path}: not an acce bench rl result with its runs (bench={doc.get('bench')!r}); "
                         "merge combines bench rl JSON files only")
    return doc


def merge_rl(paths: list[str], out: str, plot: str | None = None) -> dict[str, Any]:
    """Merge bench rl results (each task from exactly one file) into `out`; returns the written document."""
    from acce.bench.rl import _plot, summarize_task
    if len(paths) < 2:
        raise ValueError("acce bench merge needs at least two --in files (bench rl results of different tasks); "
                         "for one file use acce bench headline --in")
    docs = [(p, _read(p)) for p in paths]  # every input is checked before anything is written
    merged: dict[str, Any] = {"tasks": {}, "runs": {}, "warm_start": {}, "sources": {}, "budget_env_steps": {},
                              "counting": "per task: sources[task].counting"}
    long_runs: dict[str, Any] = {}
    for path, doc in docs:
        result, machine = doc["result"], doc.get("machine") or {}
        for task, runs in result["runs"].items():
            if task in merged["runs"]:
                raise ValueError(f"task {task!r} is in both {merged['sources'][task]['file']} and {path}: pass only "
                                 "one bench rl result per task")
            merged["runs"][task] = runs
            merged["budget_env_steps"][task] = int(result["budget_env_steps"])
            merged["warm_start"][task] = (result.get("warm_start") or {}).get(task)
            tail = (result.get("runs_long_tail") or {}).get(task)
            merged["sources"][task] = {
                "file": Path(path).name, "date": machine.get("date"), "cpu_model": machine.get("cpu_model"),
                "seeds": result.get("seeds"), "budget_env_steps": int(result["budget_env_steps"]),
                "counting": result.get("counting", OLD_COUNTING), "long_tail": tail is not None}
            if tail is not None:
                long_runs[task] = tail
    budget = merged["budget_env_steps"]
    merged["tasks"] = {t: summarize_task(t, runs, budget[t]) for t, runs in merged["runs"].items()}
    if long_runs:
        merged["runs_long_tail"] = long_runs
        merged["long_tail_tasks"] = {t: summarize_task(t, runs, budget[t]) for t, runs in long_runs.items()}
    headline = rl_headline(merged)
    machines = [d.get("machine") or {} for _, d in docs]
    doc = {"bench": "rl", "machine": {"merged_from": [Path(p).name for p, _ in docs],
                                      "cpu_models": sorted({str(m.get("cpu_model")) for m in machines}),
                                      "dates": sorted({str(m.get("date")) for m in machines})},
           "headline": headline, "result": merged}
    write_doc(Path(out), doc)
    if plot:
        _plot(merged, plot)
    return doc
