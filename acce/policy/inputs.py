"""Validation of a policy batch (VLAPolicy._inputs): every key the policy reads, with its dtype, shape and finiteness
checked, and one ValueError that names the key, what was expected and how to fix it. Split from acce/policy/vla.py by
size."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from acce.types import AUX_KEY, IMAGE_PREFIX, STATE_KEY

LANG_KEY = "lang"
"""batch key of the (B, 384) float32 instruction embeddings (policy.embed(instructions))"""
PREFIX_KEY = "prefix"
"""batch key of the committed prefix, (B, max_delay_steps, A) float32; rows past delay_steps are ignored"""
DELAY_KEY = "delay_steps"
"""batch key of the inference delay d in control steps, (B,) int, 0 <= d <= max_delay_steps"""


def batch_tensor(batch: Mapping[str, Any], key: str, dtypes: tuple[torch.dtype, ...], shape: tuple,
                 hint: str, device: torch.device, finite: bool = True) -> torch.Tensor:
    """batch[key] as a tensor on the policy's device; ValueError naming key, expectation and fix otherwise."""
    if key not in batch:
        raise ValueError(f"policy batch is missing {key!r}; {hint}")
    value = batch[key]
    try:
        t = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"policy batch[{key!r}] is not an array ({type(value).__name__}); {hint}") from None
    want = "(" + ", ".join(str(s) for s in shape) + ")"
    if t.dtype not in dtypes or t.ndim != len(shape) or any(
            isinstance(s, int) and t.shape[i] != s for i, s in enumerate(shape)):
        names = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"policy batch[{key!r}] must be {names} {want}, got {str(t.dtype).removeprefix('torch.')}"
                         f" {tuple(t.shape)}; {hint}")
    if finite and t.is_floating_point() and not bool(torch.isfinite(t).all()):
        rows = torch.nonzero(~torch.isfinite(t.reshape(t.shape[0], -1)).all(1)).flatten()[:5].tolist()
        raise ValueError(f"policy batch[{key!r}] contains NaN/inf (rows {rows}); {hint}")
    return t.to(device, non_blocking=True)


def policy_inputs(policy, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Validate a VLAPolicy's batch and return its tensors on the policy's device (images uint8, the rest
    float32/long)."""
    def tensor(key, dtypes, shape, hint, finite=True):
        return batch_tensor(batch, key, dtypes, shape, hint, policy.device, finite)

    if not isinstance(batch, Mapping):
        raise ValueError(f"policy input must be a dict of arrays, got {type(batch).__name__}")
    extra = sorted(k for k in batch if k.startswith(IMAGE_PREFIX) and k not in policy.image_keys)
    if extra:
        raise ValueError(f"policy batch has camera keys {extra} this policy was not built for; it reads "
                         f"{list(policy.image_keys)}")
    cam_hint = f"pass raw camera pixels for {list(policy.image_keys)}: uint8 (B, H, W, 3), same size for all"
    first = tensor(policy.image_keys[0], (torch.uint8,), ("B", "H", "W", 3), cam_hint)
    b, h, w = first.shape[:3]
    out = {policy.image_keys[0]: first}
    for key in policy.image_keys[1:]:
        out[key] = tensor(key, (torch.uint8,), (b, h, w, 3), cam_hint)
    out[STATE_KEY] = tensor(STATE_KEY, (torch.float32,), (b, policy.state_dim),
                            "pass raw (unnormalized) proprioception as float32; the policy normalizes it")
    out[LANG_KEY] = tensor(LANG_KEY, (torch.float32,), (b, policy.config.lang_dim),
                           "embed the instructions with policy.embed(instructions) or policy.with_lang(obs)")
    if policy.config.critic == "privileged" and batch.get(AUX_KEY) is not None:  # critic input only
        out[AUX_KEY] = tensor(AUX_KEY, (torch.float32,), (b, policy.privileged_dim),
                              "obs['aux'] holds the sim's privileged positions (training envs only)")
    m = policy.config.max_delay_steps
    if batch.get(PREFIX_KEY) is None:
        delay = batch.get(DELAY_KEY)
        if delay is not None and bool(np.any(np.asarray(delay.cpu() if torch.is_tensor(delay) else delay))):
            raise ValueError("policy batch has delay_steps > 0 but no 'prefix'; pass the committed prefix "
                             f"(B, {m}, A) float32 too")
        if m > 0:  # the plain case is exactly "no committed action, d = 0" (all delay tokens masked)
            out[PREFIX_KEY] = torch.zeros(b, m, policy.action_dim, device=policy.device)
            out[DELAY_KEY] = torch.zeros(b, dtype=torch.long, device=policy.device)
        return out
    if m == 0 and np.size(batch[PREFIX_KEY]) == 0 and not np.any(np.asarray(batch.get(DELAY_KEY, 0))):
        return out  # the runtime's empty (B, 0, A) prefix at d = 0: nothing committed, nothing to read
    if m == 0:
        raise ValueError("this policy has max_delay_steps=0 and takes no 'prefix'; drop it or raise "
                         "policy.max_delay_steps")
    out[PREFIX_KEY] = tensor(PREFIX_KEY, (torch.float32,), (b, m, policy.action_dim),
                             "pad the committed prefix to max_delay_steps rows (float32)", finite=False)
    delay = tensor(DELAY_KEY, (torch.int32, torch.int64, torch.int16, torch.uint8), (b,),
                   "give the inference delay d per row, e.g. np.zeros(B, np.int64)").long()
    if bool(((delay < 0) | (delay > m)).any()):
        raise ValueError(f"policy batch['delay_steps'] must be in [0, {m}], got {delay.tolist()}")
    valid = torch.arange(m, device=policy.device)[None] < delay[:, None]  # (B, M)
    if not bool(torch.isfinite(out[PREFIX_KEY][valid]).all()):
        raise ValueError("policy batch['prefix'] has NaN/inf inside the committed (first delay_steps) rows")
    # Rows past d are padding and may hold anything (NaN included); zero them so they cannot leak.
    out[PREFIX_KEY] = torch.where(valid[..., None], out[PREFIX_KEY], torch.zeros((), device=policy.device))
    out[DELAY_KEY] = delay
    return out

