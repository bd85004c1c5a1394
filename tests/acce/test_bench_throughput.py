"""`acce bench throughput`'s headline (issue 17: rollout env steps/s during async training over `bench sim` for the
same config, measured in the same run): the figure from hand-made results, the command's orchestration with a fake
simulator measurement and a fake run_throughput (no training, no simulator), and `acce bench headline` on a written
file, old and new."""
from __future__ import annotations

import json

import pytest

import acce.bench.throughput as tp
from acce.bench.headline import throughput_headline
from acce.cli import main


def _mode(produced: float, consumed: float | None) -> dict:
    return {"env_steps_per_s": produced, "consumed_env_steps_per_s": consumed, "env_steps": 1, "wall_s": 1.0}


def _result(cases: dict, sim_rate: float | None = 1600.0) -> dict:
    out = {"duration_s": 20.0, "started_at": "2026-12-02T12:00:10Z", "cases": cases,
           "finished_at": "2026-12-02T12:02:00Z"}
    if sim_rate is not None:
        out["sim_limit"] = {"env_steps_per_s": sim_rate, "started_at": "2026-12-02T11:59:58Z"}
    return out


DEFAULT = {"default": {"sync": _mode(700.0, 500.0), "async": _mode(1000.0, 800.0)}}


def test_headline_hand_numbers():
    # the simulator alone: 1,600 env steps/s; async rollout 1,000 -> 1,000 / 1,600 = 0.625; the learner consumed
    # 800/s -> 800 / 1,600 = 0.5; sync's rates play no part
    h = throughput_headline(_result(DEFAULT))
    assert h["rollout_over_bench_sim"] == pytest.approx(0.625)
    assert h["consumed_over_bench_sim"] == pytest.approx(0.5)
    assert (h["rollout_env_steps_per_s"], h["consumed_env_steps_per_s"], h["bench_sim_env_steps_per_s"]) == (
        1000.0, 800.0, 1600.0)
    assert h["bench_sim_measured_at"] == "2026-12-02T11:59:58Z" and h["rl_cases_started_at"] == "2026-12-02T12:00:10Z"
    assert "rollout" in h["definition"] and h["reasons"] == {}
    assert list(h)[-1] == "reasons"


def test_headline_nulls_carry_reasons():
    # no default case (a sweep-only run): every rate of the default case is null, the sim rate is still reported
    sweep = throughput_headline(_result({"tail_sigma_1": DEFAULT["default"]}))
    assert sweep["rollout_over_bench_sim"] is None and sweep["consumed_over_bench_sim"] is None
    assert "no default case" in sweep["reasons"]["rollout_over_bench_sim"]
    assert sweep["bench_sim_env_steps_per_s"] == 1600.0
    # an async run whose events had no consumed counts: the rollout ratio stands, the consumed one is null
    no_consumed = throughput_headline(_result({"default": {"async": _mode(1000.0, None)}}))
    assert no_consumed["rollout_over_bench_sim"] == pytest.approx(0.625)
    assert "consumed rate" in no_consumed["reasons"]["consumed_over_bench_sim"]
    # a file written before the simulator was measured in the same run
    old = throughput_headline(_result(DEFAULT, sim_rate=None))
    assert old["rollout_over_bench_sim"] is None and old["rollout_env_steps_per_s"] == 1000.0
    assert "no simulator measurement" in old["reasons"]["rollout_over_bench_sim"]
    zero = throughput_headline(_result(DEFAULT, sim_rate=0.0))
    assert zero["bench_sim_env_steps_per_s"] is None and "0 env steps/s" in zero["reasons"]["rollout_over_bench_sim"]


class Calls:
    def __init__(self):
        self.order: list[str] = []
        self.sim_cfg = None


@pytest.fixture
def fakes(monkeypatch):
    """measure_sim_limit and run_throughput replaced by fakes that record their order and arguments."""
    calls = Calls()

    def sim(cfg):
        calls.order.append("sim")
        calls.sim_cfg = cfg
        return {"env_steps_per_s": 1600.0, "started_at": "t0", "finished_at": "t1"}

    def run(config, overrides, duration_s, cases):
        calls.order.append("rl")
        return _result({c: DEFAULT["default"] for c in cases}, sim_rate=None)
    monkeypatch.setattr(tp, "measure_sim_limit", sim)
    monkeypatch.setattr(tp, "run_throughput", run)
    return calls


def test_bench_throughput_measures_the_sim_first_and_writes_the_headline_on_top(fakes, tmp_path):
    out = tmp_path / "throughput.json"
    assert main(["bench", "throughput", "--config", "configs/debug.yaml", "--cases", "default,long_tail",
                 "--out", str(out), "env.num_envs=3"]) == 0
    assert fakes.order == ["sim", "rl"]  # the simulator first, then the RL cases
    assert fakes.sim_cfg.env.num_envs == 3  # the default case's config: the same overrides
    doc = json.loads(out.read_text())
    assert list(doc) == ["bench", "machine", "headline", "result"]
    assert doc["headline"]["rollout_over_bench_sim"] == pytest.approx(0.625)
    assert doc["result"]["sim_limit"]["env_steps_per_s"] == 1600.0 and "headline" not in doc["result"]
    # recomputing the written file gives the same figures
    assert main(["bench", "headline", "--in", str(out)]) == 0
    again = json.loads(out.read_text())
    assert again["headline"]["consumed_over_bench_sim"] == pytest.approx(0.5) and again["result"] == doc["result"]


def test_no_default_case_skips_the_sim_and_says_why(fakes, tmp_path):
    out = tmp_path / "sweep.json"
    assert main(["bench", "throughput", "--config", "configs/debug.yaml", "--cases", "long_tail",
                 "--out", str(out)]) == 0
    assert fakes.order == ["rl"]
    h = json.loads(out.read_text())["headline"]
    assert h["rollout_over_bench_sim"] is None and "no default case" in h["reasons"]["rollout_over_bench_sim"]
    assert "no default case in --cases 'long_tail'" in h["reasons"]["bench_sim_env_steps_per_s"]
    assert main(["bench", "throughput", "--config", "configs/debug.yaml", "--cases", "fast"]) == 2  # one-line error
    assert fakes.order == ["rl"]  # a bad case name fails before anything is measured


def test_measure_sim_limit_uses_the_training_configs_workers_and_images(monkeypatch):
    import sim.bench
    from acce.config import load
    seen = []
    monkeypatch.setattr(sim.bench, "parallel_env_steps_per_s", lambda *a: seen.append(a) or 1234.0)
    cfg = load("configs/debug.yaml", ["rollout.num_workers=3", "rollout.execution_horizon=2", "env.image_size=48"])
    limit = tp.measure_sim_limit(cfg, duration_s=0.5)
    # (tasks, workers, num_envs, render_every, duration_s, image_size, cameras)
    assert seen == [(("reach",), 3, 2, 2, 0.5, 48, ("front",))]
    assert limit["env_steps_per_s"] == 1234.0 and limit["workers"] == 3 and limit["render_every"] == 2
    assert limit["started_at"] <= limit["finished_at"] and "parallel.3" in limit["figure"]


def test_recompute_an_old_throughput_file(tmp_path):
    path = tmp_path / "throughput.json"
    path.write_text(json.dumps({"bench": "throughput", "machine": {}, "result": {
        "duration_s": 45.0, "cases": {"default": {"sync": _mode(516.5, None), "async": _mode(651.6, None)}}}}))
    assert main(["bench", "headline", "--in", str(path)]) == 0
    doc = json.loads(path.read_text())
    h = doc["headline"]
    assert h["rollout_over_bench_sim"] is None and h["rollout_env_steps_per_s"] == 651.6
    assert "rerun acce bench throughput" in h["reasons"]["rollout_over_bench_sim"]
    assert "counting" not in doc["result"]  # the delay/wm/rl note on produced steps is not a throughput file's
    path.write_text(json.dumps({"bench": "throughput", "result": {"duration_s": 45.0}}))
    assert main(["bench", "headline", "--in", str(path)]) == 2  # no cases: one clear error
