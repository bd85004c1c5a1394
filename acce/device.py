"""Where the policy runs (docs/design.md §13): `runtime.device` resolved in the process that asks, and the placement
(device + bf16 autocast) that every role running the policy applies — the learner, the inference servers, the
evaluator. Light at import (no torch until called), like the config that names it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from acce.configlib import ConfigError

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda")
"""values of runtime.device"""
INFERENCE_BACKENDS = ("auto", "torch", "onnxruntime")
"""values of runtime.inference_backend (acce.policy.onnx_frozen): auto = ONNX Runtime for vision + trunk where it applies
(CPU, fp32, onnxruntime installed, frozen weights that stay), else torch"""
INFERENCE_PLACEMENTS = ("auto", "server", "worker")
"""values of runtime.inference_placement: one shared InferenceServer actor, an in-process server per rollout worker,
or auto = worker where the policy runs on CPU, server on CUDA"""


def own_servers(placement: str, device: str) -> bool:
    """Whether Ray rollout workers serve their envs themselves (runtime.inference_placement; device: the resolved
    'cpu' or 'cuda' of the learner and server actors)."""
    return placement == "worker" or (placement == "auto" and device == "cpu")


def resolve_device(name: str) -> "torch.device":
    """'cpu' -> cpu; 'cuda' -> cuda, or one ConfigError when this process sees no CUDA device; 'auto' -> cuda when
    this process sees one, else cpu."""
    import torch
    if name not in DEVICES:
        raise ConfigError(f"runtime.device must be one of {list(DEVICES)}, got {name!r}")
    has_cuda = torch.cuda.is_available()
    if name == "cuda" and not has_cuda:
        raise ConfigError(f"runtime.device=cuda but this process sees no CUDA device (torch {torch.__version__}, "
                          f"built for CUDA {torch.version.cuda or 'none'}); use runtime.device=auto (CUDA when "
                          "present, else CPU) or runtime.device=cpu")
    return torch.device("cuda" if name == "cuda" or (name == "auto" and has_cuda) else "cpu")


def gpus_elsewhere(rt) -> bool:
    """A Ray cluster joined by runtime.address may have its GPUs on other machines than the driver's."""
    return rt.kind == "ray" and bool(rt.address)


def driver_device(rt) -> "torch.device":
    """The device of the driver process's own policy work (cloning warm start, evaluation, the local runtime's
    roles). Checked at start-up, except that a driver without CUDA that joins a cluster (runtime.address) leaves the
    check to the learner and server actors, which run where the cluster's GPUs are."""
    import torch
    if rt.device == "cuda" and gpus_elsewhere(rt) and not torch.cuda.is_available():
        return torch.device("cpu")
    return resolve_device(rt.device)


def role_device(rt) -> str:
    """The device name Ray's learner and server actors resolve where they run: 'cuda' or 'cpu' ('auto' is decided
    once, by the driver, so every role agrees)."""
    return driver_device(rt).type if rt.device == "auto" else rt.device


def place(policy, device, amp: bool):
    """Move `policy` to `device`, with bf16 autocast of its encoder and trunk when `amp` and the device is CUDA
    (ignored on CPU, where autocast would change numbers for no speed). Returns the policy."""
    import torch
    device = torch.device(device)
    policy.to(device)
    policy.amp = bool(amp) and device.type == "cuda"
    return policy
