"""Frozen features: what the heads read that only the frozen encoder + trunk compute (docs/design.md §6).

With learner.train_scope=residual everything outside `RL_SCOPE_PREFIXES` is frozen, so the trunk outputs the heads
read (`FROZEN_KEYS`) are a pure function of the observation and the frozen weights. The inference server already
computed them when it chose the action; it ships them with the decision (`Segment.frozen_features`) stamped with
`frozen_stamp`, and the learner reuses rows whose stamp equals its own instead of running vision + trunk again.
"""
from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

import numpy as np

RL_SCOPE_PREFIXES = ("residual.", "log_std", "value_head.")
"""what learner.train_scope=residual trains: the RL residual, the exploration noise and the critic"""
FROZEN_KEYS = ("h_action", "h_value", "aux")
"""the entries of VLAPolicy.features that need vision + trunk (the rest are cheap functions of the inputs)"""
SHIPPED_PREFIX = "frozen/"
"""inference results carry frozen feature KEY as 'frozen/KEY' (flat keys: dynamic batching splits them by row)"""


def is_frozen(name: str) -> bool:
    """A parameter or buffer name that learner.train_scope=residual never changes."""
    return not name.startswith(RL_SCOPE_PREFIXES)


def frozen_stamp(policy) -> str:
    """Identifies the frozen weights: a hash of every frozen tensor (name, dtype, shape, bytes) plus the precision
    the trunk runs in (bf16 autocast gives other features). Equal stamps = the same features for the same input."""
    import torch

    h = hashlib.blake2b(digest_size=12)
    for name, t in sorted(policy.state_dict().items()):
        if is_frozen(name):
            t = t.detach().cpu().contiguous()
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"{h.hexdigest()}-{'bf16' if getattr(policy, 'amp', False) else 'fp32'}"


def shipped(feats: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """VLAPolicy.features output -> the rows to ship: 'frozen/KEY' float32 numpy arrays (absent entries skipped)."""
    return {SHIPPED_PREFIX + k: feats[k].detach().float().cpu().numpy() for k in FROZEN_KEYS
            if feats.get(k) is not None}


def stack_shipped(segments: Sequence[Any], stamp: str | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The shipped features (FROZEN_KEYS) of a batch's rows (segment-major, as collate flattens them) and the (N,)
    bool mask of rows that have them under `stamp` (rows of other segments hold zeros). stamp None -> none usable."""
    usable = [stamp is not None and s.frozen_features is not None and s.frozen_stamp == stamp for s in segments]
    have = np.concatenate([np.full(len(s), ok) for s, ok in zip(segments, usable)])
    if not have.any():
        return {}, have
    first = next(s.frozen_features for s, ok in zip(segments, usable) if ok)
    arrays = {k: np.concatenate([s.frozen_features[k] if ok else np.zeros((len(s),) + v.shape[1:], np.float32)
                                 for s, ok in zip(segments, usable)]) for k, v in first.items()}
    return arrays, have


def features_with_shipped(policy, inputs: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                          have: np.ndarray) -> dict[str, Any]:
    """policy.features(inputs), but rows where `have` take the shipped frozen features instead of running vision +
    trunk; only the other rows (e.g. imagined segments, or another frozen stamp) are computed."""
    import torch

    if not have.any():
        return policy.features(inputs)
    dev = policy.device
    frozen = {k: torch.as_tensor(arrays[k], device=dev).clone() for k in FROZEN_KEYS if k in arrays}
    if not have.all():
        missing = np.flatnonzero(~have)
        computed = policy.features({k: ([v[i] for i in missing] if isinstance(v, list) else v[missing])
                                    for k, v in inputs.items()})
        idx = torch.as_tensor(missing, device=dev)
        for k in frozen:
            frozen[k][idx] = computed[k]
    return policy.features_from(inputs, frozen)
