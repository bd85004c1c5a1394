"""Clean up an embedded Ray cluster whose driver was killed (kill -9, the OOM killer).

Ray's gcs_server and raylet die with the driver, but its `DashboardAgent` and `RuntimeEnvAgent` then report the
"unexpected" raylet death to the (dead) GCS with a fixed 60 s timeout (ray._private.utils.publish_error_to_driver)
and only exit after it: measured 61-64 s on Ray 2.60. A graceful `ray.shutdown()` does not trigger that report.

`watch()`, called when acce starts an embedded cluster, starts a small reaper process (once per driver) holding
the read end of a pipe from the driver. While the pipe is open the reaper notes, every `SCAN_S`, the driver's
Ray descendants (pid and start time); when it closes (the driver exited, however), it terminates those still alive
(same pid *and* start time: never a reused pid), then kills stragglers after `GRACE_S`. A cluster acce joins
(`runtime.address`) is never watched.
"""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import psutil

GRACE_S = 2.0
"""SIGTERM, then this long before SIGKILL"""
SCAN_S = 1.0
"""how often the reaper re-lists the driver's Ray processes (the agents start with the cluster)"""

_reaper: subprocess.Popen | None = None


def watch() -> subprocess.Popen:
    """Start the reaper for this driver (once; a second cluster in the same process reuses it)."""
    global _reaper
    if _reaper is None or _reaper.poll() is not None:
        _reaper = subprocess.Popen([sys.executable, "-m", "acce.runtime.ray_reaper", str(os.getpid())],
                                   stdin=subprocess.PIPE, start_new_session=True)  # a Ctrl-C for the run skips it
    return _reaper


def ray_descendants(pid: int) -> dict[int, float]:
    """{pid: start time} of pid's descendants that are Ray's (gcs_server, raylet, agents, ray:: workers)."""
    out = {}
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return out
    for p in children:
        try:
            if p.pid != os.getpid() and "ray" in " ".join(p.cmdline()):
                out[p.pid] = p.create_time()
        except psutil.Error:
            pass
    return out


def reap(entries: dict[int, float], grace_s: float = GRACE_S) -> list[int]:
    """Terminate, then kill, the listed {pid: start time} processes still alive; returns the pids it signalled."""
    alive = []
    for pid, created in entries.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            pass
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(alive, timeout=grace_s)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    return [p.pid for p in alive]


def _main(driver: int) -> None:
    seen: dict[int, float] = {}
    fd = sys.stdin.fileno()
    while True:
        seen.update(ray_descendants(driver))
        ready, _, _ = select.select([fd], [], [], SCAN_S)
        if ready and not os.read(fd, 4096):  # EOF: the driver is gone
            break
    time.sleep(0.5)  # a driver that exited normally has shut Ray down already; let its processes finish exiting
    reap(seen)


if __name__ == "__main__":
    _main(int(sys.argv[1]))
