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


RL_POLICY_FIELDS = ("critic", "residual_hidden")
"""policy fields an RL run may set on top of a warm start (train.init_from): heads cloning never trains"""


def policy_for_rl(policy_state: dict[str, Any], policy_cfg, privileged_dim: int):
    """A warm start's policy with the RL heads the run's config asks for (policy.critic, policy.residual_hidden):
    the cloned weights as saved, freshly built weights where a head is new or changed kind (cloning never trains
    the value head, and a new residual starts at zero, so version 0 still acts as the warm start)."""
    from acce.policy.config import PolicyConfig
    from acce.policy.norm import NormStats
    from acce.policy.vla import VLAPolicy
    saved = policy_state["config"]
    want = {f: getattr(policy_cfg, f) for f in RL_POLICY_FIELDS}
    if all(saved.get(f, getattr(PolicyConfig, f)) == v for f, v in want.items()):
        return VLAPolicy.from_state(policy_state)
    state = {**policy_state, "config": {**saved, **want},
             "privileged_dim": privileged_dim if want["critic"] == "privileged" else 0}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        built = VLAPolicy(PolicyConfig(**state["config"]), int(state["state_dim"]), int(state["action_dim"]),
                          NormStats.from_dict(state["norm"]), tuple(state.get("cameras", ("front",))),
                          vision_config=state.get("vision_config"), aux_dim=int(state.get("aux_dim", 0)),
                          privileged_dim=int(state["privileged_dim"]))
    fresh = ("value_head.",) if saved.get("critic", "trunk") != want["critic"] else ()
    weights = dict(built.state_dict())
    weights.update({k: v for k, v in policy_state["state_dict"].items() if k in weights and not k.startswith(fresh)})
    return VLAPolicy.from_state({**state, "state_dict": weights})
