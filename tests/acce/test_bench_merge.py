"""`acce bench merge`: bench rl results of different tasks into one file, tables and headline recomputed."""
from __future__ import annotations

import json

import pytest

from acce.cli import main


def _run(seed, final, reach_at, wall_at, wall_s=100.0, v0=0.4):
    """One recorded run whose validation success reaches 0.9 at (reach_at env steps, wall_at s)."""
    return {"seed": seed, "v0": v0, "final": final, "n": 100, "env_steps": 1000, "wall_s": wall_s,
            "history": [{"split": "val", "version": 0, "env_steps": 0, "wall_s": 0.0, "eval/success/T/val": v0},
                        {"split": "val", "version": 5, "env_steps": reach_at, "wall_s": wall_at,
                         "eval/success/T/val": 0.9}]}


def _doc(task, runs, budget, *, long_tail=None, date="2026-12-01"):
    rename = (lambda rs: json.loads(json.dumps(rs).replace("eval/success/T/val", f"eval/success/{task}/val")))
    result = {"tasks": {}, "runs": {task: rename(runs)}, "budget_env_steps": budget, "seeds": [0, 1],
              "warm_start": {task: {"checkpoint": "w/bc.pt", "overrides": ["bc.episodes=50"]}},
              "counting": "env_steps: consumed by the learner"}
    if long_tail is not None:
        result["runs_long_tail"] = {task: rename(long_tail)}
    return {"bench": "rl", "machine": {"date": date, "cpu_model": "AMD EPYC"}, "headline": {}, "result": result}


def test_merge_recomputes_tables_and_headline_from_every_file(tmp_path):
    # reach: async reaches 0.9 at 20 and 40 s, sync at 60 and 80 s; push: async 10 s, sync 30 s (both seeds)
    reach = {"async": [_run(0, 1.0, 400, 20.0), _run(1, 1.0, 600, 40.0)],
             "sync": [_run(0, 0.9, 800, 60.0), _run(1, 0.9, 800, 80.0)]}
    push = {"async": [_run(0, 0.95, 300, 10.0), _run(1, 0.95, 300, 10.0)],
            "sync": [_run(0, 0.9, 900, 30.0), _run(1, 0.9, 900, 30.0)]}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_doc("reach", reach, 5000)))
    b.write_text(json.dumps(_doc("push", push, 9000, long_tail=push, date="2026-12-03")))
    out = tmp_path / "rl.json"
    plot = tmp_path / "rl.png"
    assert main(["bench", "merge", "--in", str(a), "--in", str(b), "--out", str(out), "--plot", str(plot)]) == 0
    assert plot.stat().st_size > 0
    doc = json.loads(out.read_text())
    result = doc["result"]
    assert list(result["tasks"]) == ["reach", "push"]
    assert result["budget_env_steps"] == {"reach": 5000, "push": 9000}
    assert result["sources"]["reach"]["file"] == "a.json" and result["sources"]["push"]["long_tail"] is True
    assert doc["machine"]["dates"] == ["2026-12-01", "2026-12-03"]
    # per task: v0 0.4, final 1.0 (+60 points); steps to 90 %: async mean(400, 600) = 500, sync 800
    row = result["tasks"]["reach"]
    assert row["v0"] == pytest.approx(0.4) and row["final"] == pytest.approx(1.0)
    assert row["final_sync"] == pytest.approx(0.9) and row["rl_added_points"] == pytest.approx(60.0)
    assert row["steps_to_90pct"] == {"async": 500.0, "sync": 800.0}
    assert row["wall_to_90pct_s"] == {"async": 30.0, "sync": 70.0}
    # headline: (70 + 30) s sync / (30 + 10) s async = 2.5, summed over the merged tasks; long tail: push only, 3.0
    assert doc["headline"]["async_sync_wall_ratio_default"] == pytest.approx(2.5)
    assert doc["headline"]["async_sync_wall_ratio_long_tail"] == pytest.approx(3.0)
    # the merged file is a bench rl result that acce bench headline recomputes to the same figures
    assert main(["bench", "headline", "--in", str(out)]) == 0
    assert json.loads(out.read_text())["headline"]["async_sync_wall_ratio_default"] == pytest.approx(2.5)


def test_merge_refuses_bad_input_and_writes_nothing(tmp_path):
    reach = {"async": [_run(0, 1.0, 400, 20.0)], "sync": [_run(0, 0.9, 800, 60.0)]}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_doc("reach", reach, 5000)))
    b.write_text(json.dumps(_doc("reach", reach, 5000)))
    out = tmp_path / "rl.json"
    for argv in (["--in", str(a), "--in", str(b)],  # a task in two files
                 ["--in", str(a)],  # one file: that is bench headline's job
                 ["--in", str(a), "--in", str(tmp_path / "nope.json")],
                 ["--in", str(a), "--in", str(a)]):
        assert main(["bench", "merge", *argv, "--out", str(out)]) == 2
        assert not out.exists() and not (tmp_path / "rl.json.tmp").exists()
    b.write_text(json.dumps({"bench": "delay", "machine": {}, "result": {"runs": {}}}))
    assert main(["bench", "merge", "--in", str(a), "--in", str(b), "--out", str(out)]) == 2
    assert main(["bench", "merge", "--in", str(a), "--in", str(b)]) == 2  # no --out
    assert not out.exists()
