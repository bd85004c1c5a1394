"""Segments -> one learner batch: flat policy inputs, (B, T) credit arrays over executed spans and bootstrap rows."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from acce.policy.frozen import stack_shipped
from acce.types import INSTRUCTION_KEY, TASK_ID_KEY, Segment


def collate(segments: Sequence[Segment], stamp: str | None = None) -> dict[str, Any]:
    """B segments of T decisions -> flat (B*T) policy inputs + (B, T) credit arrays + bootstrap rows; "shipped":
    the rows' frozen features shipped under frozen stamp `stamp` and the mask of rows that have them."""
    b, t = len(segments), len(segments[0])
    if any(len(s) != t for s in segments):
        raise ValueError("segments in one batch must have the same length")
    odd = [s for s in segments if set(s.obs) != set(segments[0].obs)]  # else keys of segment 0 win: "aux" dropped
    if odd:
        raise ValueError(f"segments in one batch must carry the same obs keys: {sorted(segments[0].obs)} vs "
                         f"{sorted(odd[0].obs)} ({odd[0].source}); imagined 'aux' needs a world-model aux head")
    obs = {k: np.concatenate([s.obs[k] for s in segments]) for k in segments[0].obs}
    inputs = {**obs, INSTRUCTION_KEY: [i for s in segments for i in s.instruction],
              TASK_ID_KEY: np.concatenate([s.task_id for s in segments]),
              "prefix": np.concatenate([s.prefix for s in segments]),
              "delay_steps": np.concatenate([s.delay_steps for s in segments]).astype(np.int64)}
    offsets = np.cumsum([0] + [len(s.bootstrap[INSTRUCTION_KEY]) for s in segments])
    boot = {k: np.concatenate([s.bootstrap[k] for s in segments]) for k in segments[0].bootstrap
            if k != INSTRUCTION_KEY}
    boot[INSTRUCTION_KEY] = [i for s in segments for i in s.bootstrap[INSTRUCTION_KEY]]
    boot["delay_steps"] = boot["delay_steps"].astype(np.int64)
    next_index = np.stack([np.where(s.next_index >= 0, s.next_index + offsets[j], -1) for j, s in enumerate(segments)])

    def stack(name: str) -> np.ndarray:
        return np.stack([getattr(s, name) for s in segments])
    return {"inputs": inputs, "boot": boot, "B": b, "T": t, "chunk": np.concatenate([s.chunk for s in segments]),
            "mask": np.concatenate([s.exec_mask for s in segments]), "behavior_logp": stack("behavior_logp"),
            "behavior_value": stack("behavior_value"), "reward": stack("reward"), "discount": stack("discount"),
            "episode_end": stack("terminated") | stack("truncated"), "next_index": next_index,
            "behavior_version": stack("behavior_version"), "exec_len": stack("exec_len"),
            "delay_steps": stack("delay_steps"), "shipped": stack_shipped(segments, stamp)}


def select_rows(inputs: dict[str, Any], idx: np.ndarray) -> dict[str, Any]:
    """The minibatch rows `idx` of collate()'s flat inputs (instructions are a list, the rest arrays)."""
    return {k: ([v[i] for i in idx] if k == INSTRUCTION_KEY else v[idx]) for k, v in inputs.items()}
