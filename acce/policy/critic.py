"""The asymmetric critic (`policy.critic=privileged`): an MLP on what the simulator knows and a robot does not.
(The default critic is the policy's value head on the value query's trunk output, in acce.policy.vla.)

The privileged critic reads obs["aux"] (the instruction's object and goal positions, the sim's privileged labels),
the normalized proprioception, the instruction embedding and the committed prefix/delay. It is a critic input only
— the actor never sees obs["aux"] — so evaluation, `acce serve` and robots need no privileged state; where a batch
has none (evaluation envs, robots) the value is 0, a placeholder nothing reads (the learner recomputes values from
its segments, which carry the training envs' labels: learner.recompute_values must be on).
"""
from __future__ import annotations

import torch
from torch import nn

AUX_SCALE = 5.0
"""privileged positions are table coordinates in metres (|x| < 0.25): scaled to about unit range"""


class PrivilegedCritic(nn.Module):
    """value = MLP([aux * AUX_SCALE, state (normalized), proj(instruction embedding), prefix, delay])."""

    def __init__(self, privileged_dim: int, state_dim: int, lang_dim: int, prefix_dim: int, hidden: int):
        super().__init__()
        if privileged_dim <= 0:
            raise ValueError(f"a privileged critic needs privileged_dim > 0, got {privileged_dim}")
        self.privileged_dim = privileged_dim
        self.lang = nn.Linear(lang_dim, 32)
        self.net = nn.Sequential(nn.Linear(privileged_dim + state_dim + 32 + prefix_dim + 1, hidden), nn.GELU(),
                                 nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, aux: torch.Tensor | None, state: torch.Tensor, lang: torch.Tensor,
                prefix: torch.Tensor | None, delay: torch.Tensor | None, max_delay: int) -> torch.Tensor:
        b = state.shape[0]
        if aux is None:  # no privileged state (evaluation, serving): a placeholder value, never trained on
            return torch.zeros(b, device=state.device)
        parts = [aux * AUX_SCALE, state, self.lang(lang)]
        if prefix is not None:
            parts.append(prefix.reshape(b, -1))
        parts.append((delay.float() / max(max_delay, 1)).unsqueeze(-1) if delay is not None
                     else torch.zeros(b, 1, device=state.device))
        return self.net(torch.cat(parts, -1)).squeeze(-1)  # (B,)
