"""Pure learning math for the chunk-level actor-critic: per-decision returns and policy/value losses.

Functions only (no state, no I/O); every one takes torch tensors with time or samples on the last axis and an
optional leading batch. See `returns` (GAE, V-trace, semi-Markov rewards) and `losses` (decoupled PPO, GIPO).
Importing this package imports torch; `import acce` alone does not import it.
"""
from acce.algo.losses import (decoupled_ppo_loss, entropy_bonus, gaussian_kl, gipo_loss, importance_log_ratio,
                              value_loss)
from acce.algo.returns import gae, semi_markov_reward, vtrace

__all__ = [
    "decoupled_ppo_loss",
    "entropy_bonus",
    "gae",
    "gaussian_kl",
    "gipo_loss",
    "importance_log_ratio",
    "semi_markov_reward",
    "value_loss",
    "vtrace",
]
