"""A fresh policy for an env spec: the one constructor training, benchmarks and tests share (docs/design.md §11).

Neutral ground: it needs the config, states for normalization and the env spec, not the training driver, so the
deploy side and benchmarks can build a policy without importing `acce.train` or the runtime. Only what the caller
leaves out (the spec, the sim's aux-label width) is looked up through the CLI layer's factories (`acce.wiring`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from acce.types import EnvSpec

if TYPE_CHECKING:
    from acce.config import Config
    from acce.policy.vla import VLAPolicy


def build_policy(cfg: Config, states: np.ndarray, aux_dim: int | None = None, spec: EnvSpec | None = None,
                 privileged_dim: int | None = None) -> VLAPolicy:
    """A fresh policy of cfg.policy for `spec` (None: the spec of cfg.env's tasks), normalized on `states` (N, S).
    aux_dim None: the sim's aux-label width when the config trains an aux head (bc.aux_loss_coef > 0), else 0;
    privileged_dim None: the same width when policy.critic=privileged (a critic input only), else 0."""
    import torch

    from acce.policy.norm import NormStats
    from acce.policy.vla import VLAPolicy
    if spec is None:
        from acce.wiring import env_spec
        spec = env_spec(cfg)
    if aux_dim is None or privileged_dim is None:
        from acce.wiring import sim_aux_dim
        if aux_dim is None:
            aux_dim = sim_aux_dim() if cfg.bc.aux_loss_coef > 0 else 0
        if privileged_dim is None:
            privileged_dim = sim_aux_dim() if cfg.policy.critic == "privileged" else 0
    torch.manual_seed(cfg.run.seed)
    # the action description a robot bridge reads to execute the actions (type, scale, rate) comes from the spec
    norm = NormStats.from_states(states, action_repr=spec.action_repr_dict())
    return VLAPolicy(cfg.policy, spec.state_dim, spec.action_dim, norm, cameras=spec.cameras, aux_dim=aux_dim,
                     privileged_dim=privileged_dim, env_spec=spec)
