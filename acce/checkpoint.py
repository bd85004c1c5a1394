"""Atomic checkpoints: write to a temporary file in the same folder, fsync, then rename over the target.

A checkpoint holds the resolved config, the learner (policy with normalization stats, optimizer, version, RNG),
curriculum state and progress counters. Loading a policy without normalization statistics is an error.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

FORMAT = "acce-checkpoint"
VERSION = 1


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save({"format": FORMAT, "format_version": VERSION, **payload}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoints" / "latest.pt" if (path / "checkpoints").is_dir() else path / "latest.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; pass a run directory or a .pt file written by acce train")
    data = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not an acce checkpoint")
    policy = data.get("learner", {}).get("policy", {})
    if not policy.get("norm"):
        raise ValueError(f"{path} has no normalization statistics; it cannot drive a robot or an eval")
    return data


def policy_from_checkpoint(data: dict[str, Any]):
    from acce.policy.vla import VLAPolicy
    return VLAPolicy.from_state(data["learner"]["policy"])
