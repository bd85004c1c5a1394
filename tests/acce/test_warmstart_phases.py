"""scripts/diagnostics/warmstart_phases.py: the phase probe behind the main job's no-DAgger decision."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "diagnostics" / "warmstart_phases.py"


def load_script():
    spec = importlib.util.spec_from_file_location("warmstart_phases", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_up_share_counts_strong_lifts_over_all_steps():
    up_share = load_script().up_share
    a = np.zeros((3, 4), np.float32)
    a[0, 2] = 0.9   # a strong lift
    a[1, 2] = 0.5   # not above the 0.5 threshold
    b = np.zeros((1, 4), np.float32)
    b[0, 2] = 1.0
    assert up_share([a, b]) == pytest.approx(2 / 4)  # pooled over steps, not averaged per episode
    assert up_share([]) is None


@pytest.mark.slow
def test_probe_reports_every_phase_and_round(tmp_path):
    out = tmp_path / "phases.json"
    subprocess.run([sys.executable, str(SCRIPT), "--config", "configs/debug.yaml", "--run-dir", str(tmp_path / "ws"),
                    "--out", str(out), "--episodes", "2"], cwd=ROOT, check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    # debug.yaml: one DAgger round, so the policy before it and the final one
    assert [p["phase"] for p in result["phases"]] == [1, 2]
    assert all(set(p["success"]) == {"reach"} for p in result["phases"])
    assert len(result["dagger_rounds"]) == 1 and set(result["dagger_rounds"][0]["reach"]) == {
        "policy_success", "up_share_won", "up_share_lost", "up_share_executed"}
    assert result["demo_up_share"]["reach"] is not None
