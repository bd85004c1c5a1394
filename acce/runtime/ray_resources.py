"""Joining or starting the Ray cluster, and checking it has what the roles reserve: CPUs for every role, and GPUs for
the learner and the inference server when runtime.device resolves to cuda (docs/design.md §13). Split from
acce/runtime/ray_runtime.py by size."""
from __future__ import annotations

import os

import numpy as np
import ray

from acce.configlib import ConfigError
from acce.device import own_servers, role_device


def ensure_ray(rt, needed_cpus: float) -> None:
    """Join runtime.address, or start an embedded cluster watched by acce.runtime.ray_reaper (unless Ray is up)."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a one-machine cluster on loopback; no token prompt
    # Logical CPUs only schedule actors; real contention is bounded by runtime.torch_threads. An embedded
    # cluster is sized so every role fits (an actor that cannot be placed would wait forever).
    cpus = rt.num_cpus or max(os.cpu_count() or 1, int(np.ceil(needed_cpus)))
    ray.init(address=rt.address or None, num_cpus=None if rt.address else cpus,
             include_dashboard=False, log_to_driver=True, configure_logging=False)
    if not rt.address:  # our own cluster: its agents must not outlive a killed driver by a minute
        from acce.runtime.ray_reaper import watch
        watch()


def start_cluster(cfg, imagination_cpus: float) -> tuple[str, float, float]:
    """Resolve the roles' device, join or start the cluster, and check its resources. Returns (device name for the
    learner and server actors, their GPU reservations: 0 unless the device is cuda)."""
    rt = cfg.runtime
    device = role_device(rt)  # before Ray starts: runtime.device=cuda without CUDA fails here, in one line
    # workers that serve themselves need no server actor, unless imagination workers need one
    no_server = own_servers(rt.inference_placement, device) and not cfg.imagination.enabled
    server_cpus = 0.0 if no_server else rt.server_cpus
    needed = cfg.rollout.num_workers * rt.worker_cpus + rt.learner_cpus + server_cpus + imagination_cpus
    ensure_ray(rt, needed)
    have = ray.cluster_resources().get("CPU", 0.0)
    if have < needed:
        raise ValueError(f"the Ray cluster has {have:g} CPUs but the roles request {needed:g} "
                         f"({cfg.rollout.num_workers} workers x runtime.worker_cpus={rt.worker_cpus:g} + "
                         f"learner {rt.learner_cpus:g} + server {server_cpus:g} + imagination "
                         f"{imagination_cpus:g}); lower them or add machines")
    for name, per_worker in rt.worker_resources.items():  # workers that cannot be placed would wait forever
        want, have_r = cfg.rollout.num_workers * per_worker, ray.cluster_resources().get(name, 0.0)
        if have_r < want:
            raise ConfigError(f"runtime.worker_resources.{name}={per_worker:g} x {cfg.rollout.num_workers} workers "
                              f"needs {want:g} but the Ray cluster has {have_r:g}; start the rollout nodes with "
                              f"`ray start --address=HEAD:PORT --resources='{{\"{name}\": {want:g}}}'` and join "
                              "that cluster with runtime.address (launch/README.md), or lower it")
    learner_gpus, server_gpus = (rt.learner_gpus, 0.0 if no_server else rt.server_gpus) if device == "cuda" \
        else (0.0, 0.0)
    have_gpus = ray.cluster_resources().get("GPU", 0.0)
    if learner_gpus + server_gpus > have_gpus:  # an actor that cannot be placed would wait forever
        raise ConfigError(f"runtime.device=cuda reserves runtime.learner_gpus={learner_gpus:g} + "
                          f"runtime.server_gpus={server_gpus:g} GPUs but the Ray cluster has {have_gpus:g}; "
                          "lower them (e.g. 0.5 each on one GPU) or add GPU machines")
    return device, learner_gpus, server_gpus
