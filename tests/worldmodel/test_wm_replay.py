"""Replaying the pretraining data during online fine-tuning (imagination.wm_replay_from / wm_replay_fraction)."""
import dataclasses

import numpy as np
import pytest
import torch
from test_wm_aux import aux_episode, aux_model
from wm_helpers import collect_reach_store, fake_episode, tiny_cfg, tiny_model

from acce.config import load
from acce.configlib import ConfigError
from worldmodel.data import from_episode
from worldmodel.trainer import WorldModelTrainer

IMAGINATION = ["imagination.num_workers=1", "imagination.imagined_fraction=0.5", "env.image_size=32"]


def _arrays(n: int, seed0: int, steps: int = 6, **kw):
    return [from_episode(fake_episode(steps, seed0 + k, **kw), ("front",)) for k in range(n)]


@pytest.mark.parametrize("fraction, replayed", [(0.0, 0), (0.25, 2), (0.5, 4), (0.9, 7), (0.99, 7)])
def test_each_batch_draws_its_replay_share(fraction, replayed):
    trainer = WorldModelTrainer(tiny_model().train())  # batch_size 8
    trainer.add_episodes([fake_episode(6, k, task_id=1) for k in range(3)])
    assert trainer.set_replay(_arrays(4, 100, task_id=2), fraction) == 4
    for _ in range(3):
        batch = trainer._sample()
        assert len(batch["instruction"]) == 8
        assert sum(i.startswith("task 2") for i in batch["instruction"]) == replayed
    assert trainer.train_steps(1)["wm/replay_episodes"] == 4


def test_replay_keeps_what_the_model_learned_from_the_wider_data():
    """Fit on data A, then fine-tune on a few episodes of B: with A replayed the loss on A rises much less."""
    torch.manual_seed(0)
    cfg = tiny_cfg(lr=3e-3)
    a, b = _arrays(8, 0), _arrays(2, 500)
    from worldmodel.data import make_windows
    held = make_windows([(ep, 0) for ep in a], cfg.seq_len)

    def finetuned(fraction):
        trainer = WorldModelTrainer.create(cfg, state_dim=7, action_dim=4, control_hz=10.0, seed=0)
        trainer.add_arrays(a)
        trainer.train_steps(60)
        before = trainer.evaluate([held])["total"]
        trainer.buffer.episodes.clear()
        trainer.add_arrays(b)
        if fraction:
            trainer.set_replay(a, fraction)
        trainer.train_steps(60)
        return before, trainer.evaluate([held])["total"]

    before, plain = finetuned(0.0)
    _, replayed = finetuned(0.5)
    assert plain - before > 2 * max(replayed - before, 0.0) and plain > replayed


def test_replay_data_must_fit_the_model():
    trainer = WorldModelTrainer(aux_model().train())
    with pytest.raises(ValueError, match="replay data.*no obs\\['aux'\\]"):
        trainer.set_replay(_arrays(2, 0), 0.5)
    trainer.set_replay([from_episode(aux_episode(4, 0), ("front",))], 0.5)
    plain = WorldModelTrainer(tiny_model().train())
    with pytest.raises(ValueError, match="shapes"):
        plain.set_replay(_arrays(2, 0, size=16), 0.5)
    with pytest.raises(ValueError, match="\\[0, 1\\)"):
        plain.set_replay(_arrays(2, 0), 1.0)
    with pytest.raises(ValueError, match="no episode with a transition"):
        plain.set_replay([dataclasses.replace(ep, action=ep.action[:0]) for ep in _arrays(2, 0)], 0.5)
    assert plain.replay is None  # a refused replay leaves the trainer as it was


def test_the_online_trainer_replays_the_store_named_in_the_config(tmp_path):
    from acce import wiring
    collect_reach_store(tmp_path / "pre.zarr", episodes=4)
    tiny_model().save(tmp_path / "wm.pt")
    cfg = load(None, [*IMAGINATION, f"imagination.wm_init_from={tmp_path / 'wm.pt'}",
                      f"imagination.wm_replay_from={tmp_path / 'pre.zarr'}", "imagination.wm_replay_fraction=0.25"])
    trainer = wiring.wm_trainer_factory(cfg)(fake_episode(5, 0))
    assert len(trainer.replay) == 4 and trainer.replay_fraction == 0.25
    off = load(None, [*IMAGINATION, f"imagination.wm_init_from={tmp_path / 'wm.pt'}",
                      f"imagination.wm_replay_from={tmp_path / 'pre.zarr'}", "imagination.wm_replay_fraction=0"])
    assert wiring.wm_trainer_factory(off)(fake_episode(5, 0)).replay is None


@pytest.mark.parametrize("overrides, match", [
    (["imagination.wm_replay_fraction=1.0"], "must be in \\[0, 1\\)"),
    (["imagination.wm_replay_fraction=-0.1"], "must be in \\[0, 1\\)"),
    (["imagination.wm_replay_from=/nonexistent/data"], "neither an acce episode store"),
])
def test_bad_replay_settings_are_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load(None, [*IMAGINATION, *overrides])


def test_replay_windows_cover_replay_episodes_in_proportion_to_length():
    from worldmodel.data import SequenceBuffer
    buf = SequenceBuffer(_arrays(1, 0, steps=2) + _arrays(1, 1, steps=6))
    wins = buf.windows(4000, 4, np.random.default_rng(0))
    share_long = np.mean([ep.num_steps == 6 for ep, _ in wins])
    assert abs(share_long - 0.75) < 0.03  # uniform over transitions: 6 of 8
