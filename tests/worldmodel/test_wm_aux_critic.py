"""Imagination with a privileged critic (policy.critic=privileged): the startup check on the world model's aux head,
and learner batches that mix simulator and imagined segments (before the aux head: a KeyError in collate)."""
import dataclasses

import numpy as np
import pytest
import torch
from test_imagination_pipeline import TINY_WM, _local_runtime, _run_until_imagined_consumed
from test_wm_aux import aux_episode, aux_model
from wm_helpers import tiny_model

from acce.config import load
from acce.configlib import ConfigError
from acce.runtime.learner import collate
from acce.types import AUX_KEY
from worldmodel.model import WorldModel

PRIVILEGED = ["policy.critic=privileged"]


def _cfg(*extra):
    return load(None, ["imagination.num_workers=1", "imagination.imagined_fraction=0.5", "env.image_size=32",
                       *extra])


def test_privileged_critic_with_a_pretrained_model_without_aux_head_fails_at_startup(tmp_path):
    from acce import wiring
    tiny_model().save(tmp_path / "plain.pt")
    with pytest.raises(ConfigError, match="no aux head.*wm_init_from empty"):
        wiring.wm_trainer_factory(_cfg(*PRIVILEGED, f"imagination.wm_init_from={tmp_path / 'plain.pt'}"))
    # the same model is fine for the default critic, and a model with the sim's aux head for the privileged one
    wiring.wm_trainer_factory(_cfg(f"imagination.wm_init_from={tmp_path / 'plain.pt'}"))
    torch.manual_seed(0)
    model = WorldModel(tiny_model().cfg, state_dim=7, action_dim=4, control_hz=10.0, aux_dim=wiring.sim_aux_dim())
    model.fit_normalization(np.zeros((4, 7)), np.zeros(4), np.zeros((4, wiring.sim_aux_dim())))
    model.save(tmp_path / "aux.pt")
    wiring.wm_trainer_factory(_cfg(*PRIVILEGED, f"imagination.wm_init_from={tmp_path / 'aux.pt'}"))


def test_a_fresh_online_model_gets_an_aux_head_exactly_for_a_privileged_critic():
    from acce import wiring
    first = aux_episode(4, 0)
    assert wiring.wm_trainer_factory(_cfg(*PRIVILEGED, *TINY_WM))(first).model.aux_dim == wiring.sim_aux_dim()
    assert wiring.wm_trainer_factory(_cfg(*TINY_WM))(first).model.aux_dim == 0


def test_imagined_envs_carry_aux_exactly_when_the_sim_envs_do():
    from acce import wiring
    episodes = [aux_episode(5, k) for k in range(2)]
    model = aux_model()
    pub = {"version": 1, "desc": model.describe(), "state": model.state_dict()}
    env = wiring.imagined_env_factory(_cfg(*PRIVILEGED, *TINY_WM))(1000, pub)
    env.add_episodes(episodes)
    assert env.reset()[AUX_KEY].shape == (env.num_envs, wiring.sim_aux_dim())
    env = wiring.imagined_env_factory(_cfg(*TINY_WM))(1000, pub)  # default critic: sim segments have no aux
    env.add_episodes(episodes)
    assert AUX_KEY not in env.reset()
    plain = tiny_model()
    with pytest.raises(ConfigError, match="no aux head"):
        wiring.imagined_env_factory(_cfg(*PRIVILEGED, *TINY_WM))(
            1000, {"version": 1, "desc": plain.describe(), "state": plain.state_dict()})


def test_mixed_batches_give_the_privileged_critic_real_values_for_imagined_states():
    cfg, learner, rt = _local_runtime(PRIVILEGED)
    batches = []
    update = learner.update
    learner.update = lambda segments: (batches.append(list(segments)), update(segments))[1]
    try:
        _run_until_imagined_consumed(rt, extra_updates=0)
    finally:
        rt.shutdown()
    batch = next(b for b in batches if any(s.source == "imagined" for s in b))
    (imagined,) = [s for s in batch if s.source == "imagined"]
    t, p = len(imagined), learner.policy.privileged_dim
    assert imagined.obs[AUX_KEY].shape == (t, p) and imagined.obs[AUX_KEY].dtype == np.float32
    assert imagined.bootstrap[AUX_KEY].shape[1:] == (p,)
    data = collate(batch)
    assert data["inputs"][AUX_KEY].shape == (len(batch) * t, p)
    policy = learner.policy.eval()
    with torch.no_grad():
        _, _, values = policy.heads(policy.features(policy.with_lang(data["inputs"])))
    rows = [i for i, s in enumerate(batch) if s.source == "imagined"][0] * t + np.arange(t)
    v = values[torch.as_tensor(rows)]
    assert (v != 0).all() and float(v.std()) > 0, "the critic returned its no-aux placeholder for imagined states"
    # a segment without the labels (a world model without an aux head) is an error, never a silently dropped key
    bare = dataclasses.replace(imagined, obs={k: a for k, a in imagined.obs.items() if k != AUX_KEY})
    with pytest.raises(ValueError, match="aux head"):
        collate([s if s is not imagined else bare for s in batch])
    with pytest.raises(ValueError, match="same obs keys"):
        collate([bare] + [s for s in batch if s is not imagined])
