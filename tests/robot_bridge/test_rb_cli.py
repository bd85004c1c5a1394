"""`acce serve` / `acce robot` argument handling (through robot_bridge.cli.main, which `acce` wraps)."""
import argparse
import json
import subprocess
import sys
from pathlib import Path

from robot_bridge.cli import add_parsers, main

ROOT = Path(__file__).resolve().parents[2]


def test_add_parsers_gives_serve_and_robot():
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["serve", "--checkpoint", "c.pt"])
    assert (args.host, args.port, args.token, args.command) == ("127.0.0.1", 8000, None, "serve")
    args = parser.parse_args(["robot", "--robot", "sim", "--policy", "ws://127.0.0.1:8000", "--task", "reach",
                              "--episodes", "3", "--out", "d"])
    assert (args.robot, args.policy, args.checkpoint, args.episodes) == ("sim", "ws://127.0.0.1:8000", None, 3)


def test_serve_refuses_public_bind_without_token(capsys, checkpoint):
    assert main(["serve", "--checkpoint", str(checkpoint), "--host", "0.0.0.0"]) == 2
    assert "token" in capsys.readouterr().err


def test_robot_with_local_checkpoint_and_mock_robot(tmp_path, checkpoint, capsys):
    code = main(["robot", "--robot", "mock", "--checkpoint", str(checkpoint), "--max-steps", "6",
                 "--instruction", "touch the red cube", "--out", str(tmp_path), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 1 and summary["executor_counts"]["replies"] >= 1
    assert (tmp_path / "latency.json").is_file() and (tmp_path / "episodes.zarr").is_dir()


def test_robot_reports_unreachable_server_in_one_line():
    done = subprocess.run([sys.executable, "-m", "robot_bridge.cli", "robot", "--robot", "sim", "--policy",
                           "ws://127.0.0.1:9"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot reach the policy server" in done.stderr
    assert "Traceback" not in done.stderr


def test_acce_does_not_import_robot_bridge():
    code = "import sys, acce, acce.cli, acce.types; print(any(m.startswith('robot_bridge') for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
