"""Fault injection: kill -9 the driver of an embedded Ray cluster. Ray's DashboardAgent and RuntimeEnvAgent then
spend a fixed 60 s reporting the raylet's death to the dead GCS before they exit; acce's reaper must end them
within seconds. And the reaper must never signal a process that merely reuses a recorded pid."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from acce.runtime.ray_reaper import reap

DRIVER = """
from acce.config import load
from acce.runtime.ray_runtime import ensure_ray
ensure_ray(load(None, []).runtime, 1)
print("READY", flush=True)
import time; time.sleep(600)
"""
AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _agents(driver: psutil.Process) -> list[psutil.Process]:
    out = []
    for p in driver.children(recursive=True):
        try:
            if " ".join(p.cmdline()).startswith(AGENTS):
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.mark.slow
def test_ray_agents_do_not_outlive_a_killed_driver():
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        driver = psutil.Process(proc.pid)
        deadline = time.monotonic() + 30
        while len(agents := _agents(driver)) < 2:
            assert time.monotonic() < deadline, "Ray's agents did not start"
            time.sleep(0.2)
        reaper = [p for p in driver.children() if "acce.runtime.ray_reaper" in " ".join(p.cmdline())]
        assert len(reaper) == 1
        time.sleep(2.5)  # the reaper lists the cluster's processes every second
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        gone, alive = psutil.wait_procs(agents + reaper, timeout=15)  # Ray alone: ~60 s
        assert not alive, f"still running 15 s after the driver died: {[p.pid for p in alive]}"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_reap_signals_only_the_recorded_process():
    p = subprocess.Popen(["sleep", "30"])
    try:
        created = psutil.Process(p.pid).create_time()
        assert reap({p.pid: created + 5.0}, grace_s=0.1) == []  # same pid, another start time: a reused pid
        assert p.poll() is None
        assert reap({p.pid: created}, grace_s=2.0) == [p.pid]
        p.wait(timeout=5)
        assert not psutil.pid_exists(p.pid)
        assert reap({p.pid: created}) == []  # gone: nothing to do
    finally:
        if p.poll() is None:
            p.kill()
