"""Atomic checkpoints: write to a temporary file in the same folder, fsync, then rename over the target.
A save killed mid-write leaves its temp file; later saves and loads remove those of writers no longer running.

A checkpoint holds the resolved config, the learner (policy with normalization stats, optimizer, version, RNG),
curriculum state and progress counters. Loading a policy without normalization statistics is an error.
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import torch

FORMAT = "acce-checkpoint"
VERSION = 1
STALE_TEMP_AGE_S = 600.0
"""load_checkpoint removes dead writers' temp files only this much older than now (save removes them at any age)"""


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, "format_version": VERSION, **payload}, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as err:  # disk full, interrupted: the previous checkpoint stays, no partial file is left
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"no space left on the device while saving {path}; the previous "
                          "checkpoint there is intact: free some space, then resume the run") from None
        raise
    os.replace(tmp, path)
    return path


def remove_stale_temps(path: Path, min_age_s: float = 0.0) -> list[Path]:
    """Remove the `.<name>.tmp-<pid>` files that saves of `path` killed mid-write left (their pid is not running
    and they are at least min_age_s old); returns them. A live writer's temp file is never touched."""
    removed = []
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        try:
            if not pid.isdigit() or _pid_alive(int(pid)) or time.time() - tmp.stat().st_mtime < min_age_s:
                continue
            tmp.unlink()
        except FileNotFoundError:  # its writer renamed it meanwhile
            continue
        removed.append(tmp)
    return removed


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoints" / "latest.pt" if (path / "checkpoints").is_dir() else path / "latest.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; pass a run directory or a .pt file written by acce train")
    # Loading is also how a run resumes; a reader on another machine may see a live writer's pid as dead, hence
    # the age limit (a write in progress keeps its temp file's mtime fresh).
    remove_stale_temps(path, min_age_s=STALE_TEMP_AGE_S)
    try:
        data = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, ... for a damaged file
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{path} cannot be read as a checkpoint ({type(err).__name__}: {why}); it is truncated or "
                         "damaged (an interrupted copy?): copy it again, or use another checkpoint of the run "
                         "(checkpoints/bc.pt is the warm start)") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not an acce checkpoint")
    policy = data.get("learner", {}).get("policy", {})
    if not policy.get("norm"):
        raise ValueError(f"{path} has no normalization statistics; it cannot drive a robot or an eval")
    return data


def policy_from_checkpoint(data: dict[str, Any]):
    """The checkpoint's policy, with its env spec (derived from the run's config for checkpoints saved before
    policies carried one)."""
    from acce.policy.vla import VLAPolicy
    return VLAPolicy.from_state(data["learner"]["policy"], image_size=checkpoint_image_size(data))


def checkpoint_image_size(data: dict[str, Any]) -> int | None:
    """env.image_size of the run that wrote a checkpoint (None when the checkpoint has no config)."""
    size = (data.get("config") or {}).get("env", {}).get("image_size")
    return int(size) if size is not None else None


RL_POLICY_FIELDS = ("critic", "residual_hidden", "residual_reads_aux", "residual_reads_lang")
"""policy fields an RL run may set on top of a warm start (train.init_from): heads cloning never trains"""


def policy_for_rl(policy_state: dict[str, Any], policy_cfg, privileged_dim: int, image_size: int | None = None):
    """A warm start's policy with the RL heads the run's config asks for (policy.critic, policy.residual_hidden):
    the cloned weights as saved, freshly built weights where a head is new or changed kind (cloning never trains
    the value head, and a new residual starts at zero, so version 0 still acts as the warm start). image_size: as
    in VLAPolicy.from_state (a warm start saved without an env spec gets one derived)."""
    from acce.policy.config import PolicyConfig
    from acce.policy.norm import NormStats
    from acce.policy.vla import VLAPolicy
    saved = policy_state["config"]
    want = {f: getattr(policy_cfg, f) for f in RL_POLICY_FIELDS}
    changed = {f for f, v in want.items() if saved.get(f, getattr(PolicyConfig, f)) != v}
    if not changed:
        return VLAPolicy.from_state(policy_state, image_size)
    state = {**policy_state, "config": {**saved, **want},
             "privileged_dim": privileged_dim if want["critic"] == "privileged" else 0}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        built = VLAPolicy(PolicyConfig(**state["config"]), int(state["state_dim"]), int(state["action_dim"]),
                          NormStats.from_dict(state["norm"]), tuple(state.get("cameras", ("front",))),
                          vision_config=state.get("vision_config"), aux_dim=int(state.get("aux_dim", 0)),
                          privileged_dim=int(state["privileged_dim"]))
    fresh = ("value_head.",) if "critic" in changed else ()
    # a residual whose inputs or width changed starts afresh (at zero); a warm start's trained one is kept as saved
    if any(f.startswith("residual_") for f in changed):
        fresh += ("residual.",)
    weights = dict(built.state_dict())
    weights.update({k: v for k, v in policy_state["state_dict"].items() if k in weights and not k.startswith(fresh)})
    return VLAPolicy.from_state({**state, "state_dict": weights}, image_size)
