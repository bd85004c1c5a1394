"""Env groups on threads, shared by evaluation (acce/runtime/evaluator.py) and the DAgger rounds (acce/dagger.py):
one group's simulator steps while another's batch is in the policy. MuJoCo's step and rendering and torch's forward
pass release the GIL, so two groups keep both cores of a 2-core machine busy where one left a core idle."""
from __future__ import annotations

import threading
from typing import Any, Callable


def run_threads(fn: Callable[..., Any], jobs: list[tuple], name: str) -> list[Any]:
    """fn(*job) for every job at once, one thread each (never a pool, which could run two jobs one after the other),
    results in job order; the first job's error is raised once every job has stopped."""
    results: list[Any] = [None] * len(jobs)

    def one(k: int) -> None:
        try:
            results[k] = fn(*jobs[k])
        except BaseException as exc:  # re-raised in the caller's thread below
            results[k] = exc

    threads = [threading.Thread(target=one, args=(k,), name=f"{name}-{k}", daemon=True) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def one_torch_thread(groups: int) -> Callable[[], None]:
    """For `groups` > 1 env groups on threads: forward passes on one torch thread, so the other core steps another
    group's envs meanwhile (docs/decisions.md), but only on the main thread, where the work has the process to itself
    (`acce eval`, version 0 and the final evaluations, the warm start); one group or a background evaluation changes
    nothing. Returns what restores the setting."""
    if groups <= 1 or threading.current_thread() is not threading.main_thread():
        return lambda: None
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    return lambda: torch.set_num_threads(before)
