"""Fault injection: kill -9 a rollout worker in the middle of `acce train` on Ray. The run must finish, Ray must
restart the worker, and the restart must be counted where a user looks: stderr, summary.json and TensorBoard."""
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from acce.cli import main

pytestmark = pytest.mark.slow


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _descends_from_us(pid: int) -> bool:
    """Only this test's Ray cluster (started by this process): never another run's workers on the machine."""
    me = os.getpid()
    while pid > 1:
        pid = _parent(pid)
        if pid == me:
            return True
    return False


def _worker_pids() -> list[int]:
    """Processes of this test's cluster running a WorkerActor's production loop (Ray sets the title; Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # "ray::WorkerActor.run": the actor is in its production loop (not still starting up)
                if b"ray::WorkerActor.run" in (entry / "cmdline").read_bytes() and _descends_from_us(int(entry.name)):
                    pids.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return pids


@pytest.mark.parametrize("max_staleness", [8, 0])
def test_killed_worker_mid_run_is_restarted_counted_and_said(tmp_path, ray_cluster, capsys, max_staleness):
    """max_staleness 0: the staleness gate must get back what the dead worker was admitted for, or it denies every
    later segment and the run stalls (StalenessGate.release_worker)."""
    killed: list[int] = []

    def killer():
        deadline = time.time() + 240  # the run's own wall limit: a loaded machine can take minutes to start workers
        while time.time() < deadline and not killed:
            pids = _worker_pids()
            if pids:
                time.sleep(1.0)  # let it produce a little first
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
            time.sleep(0.2)
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    assert main(["train", "--config", "configs/debug.yaml", f"run.out_dir={tmp_path}", "run.name=kill",
                 "train.max_versions=120", "runtime.timeout_s=30", f"learner.max_staleness={max_staleness}",
                 "train.max_wall_s=240", "--quiet"]) == 0
    thread.join(timeout=5)
    assert killed, "no rollout worker process was found to kill"
    summary = json.loads((tmp_path / "kill" / "summary.json").read_text())
    assert summary["worker_restarts"] >= 1
    assert summary["learner_version"] >= 120, "training stalled after the kill (it ran out of wall-clock instead)"
    assert "a rollout worker's process died and Ray restarted it" in capsys.readouterr().err
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tmp_path / "kill" / "tb"))
    ea.Reload()
    assert max(e.value for e in ea.Scalars("progress/worker_restarts")) >= 1
