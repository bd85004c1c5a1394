import numpy as np
import pytest
import torch
from wm_helpers import fake_episode, tiny_cfg

from worldmodel.trainer import WorldModelTrainer


def _trainer(**kw) -> WorldModelTrainer:
    return WorldModelTrainer.create(tiny_cfg(**kw), state_dim=7, action_dim=4, control_hz=10.0)


def test_trainer_needs_real_episodes_first():
    trainer = _trainer()
    with pytest.raises(RuntimeError, match="add_episodes"):
        trainer.train_steps(1)
    assert trainer.add_episodes([fake_episode(4, 0, source="imagined")]) == 0
    assert trainer.skipped_imagined == 1 and not bool(trainer.model.stats_ready)


def test_online_training_lowers_the_loss_and_publishes_versions():
    trainer = _trainer(lr=3e-3)
    assert trainer.add_episodes([fake_episode(6, k) for k in range(2)]) == 2
    assert bool(trainer.model.stats_ready)  # normalization fitted from the first real episodes, then frozen
    stats = trainer.model.normalization()
    first = trainer.train_steps(3)
    assert set(first) >= {"wm/loss/total", "wm/loss/latent", "wm/loss/reward", "wm/loss/done", "wm/version",
                          "wm/disagreement/train", "wm/train_sps"}
    assert all(k.startswith("wm/") for k in first) and first["wm/version"] == 3
    for _ in range(8):
        last = trainer.train_steps(5)
    assert last["wm/loss/total"] < 0.7 * first["wm/loss/total"]
    version, state = trainer.publish()
    assert version == trainer.version == 43
    assert trainer.model.normalization() == stats
    trainer.train_steps(1)
    assert not torch.equal(state["reward_head.0.weight"], trainer.model.state_dict()["reward_head.0.weight"])
    assert all(t.device.type == "cpu" for t in state.values())


def test_buffer_keeps_the_most_recent_episodes():
    trainer = _trainer(start_buffer_episodes=2)
    trainer.add_episodes([fake_episode(3, k) for k in range(5)])
    assert len(trainer.buffer) == 2 and trainer.episodes_added == 5
    batch = trainer.buffer.sample(4, 4, np.random.default_rng(0))
    assert batch["images"].shape == (4, 5, 32, 32, 3) and batch["mask"].sum(1).max() == 3


def test_a_published_model_rebuilds_in_another_process():
    from worldmodel.model import WorldModel
    trainer = _trainer()
    trainer.add_episodes([fake_episode(5, 0)])
    trainer.train_steps(2)
    version, state = trainer.publish()
    copy = WorldModel.from_state(trainer.model.describe(), version, state)
    assert copy.version == 2 and copy.normalization() == trainer.model.normalization()
    for name, value in copy.state_dict().items():
        assert torch.equal(value, state[name]), name
