"""The world model's optional aux head (privileged labels for a privileged critic): its loss with hand-computed
numbers, training, ImaginedEnv's obs["aux"], checkpoints, wm-eval and wm-pretrain on a store with aux labels."""
import dataclasses

import numpy as np
import pytest
import torch
from wm_helpers import fake_episode, tiny_cfg, tiny_model

from acce.types import AUX_KEY
from worldmodel.data import from_episode, make_windows
from worldmodel.evaluate import evaluate_episodes, format_eval
from worldmodel.imagined_env import ImaginedEnv
from worldmodel.losses import aux_loss, sequence_loss, to_tensors
from worldmodel.model import WorldModel
from worldmodel.trainer import WorldModelTrainer

P = 4
"""aux width of these tests (the sim's: object and goal xy)"""


def aux_episode(steps: int, seed: int, **kw):
    """fake_episode plus obs["aux"]: a fixed linear function of the state, so a latent that holds the state can
    predict it (labels in metres, like the sim's)."""
    ep = fake_episode(steps, seed, **kw)
    ep.obs[AUX_KEY] = (0.1 * ep.obs["state"][:, :P]).astype(np.float32)
    return ep


def aux_model(seed: int = 0, **overrides) -> WorldModel:
    torch.manual_seed(seed)
    model = WorldModel(tiny_cfg(**overrides), state_dim=7, action_dim=4, control_hz=10.0, aux_dim=P)
    rng = np.random.default_rng(seed)
    model.fit_normalization(rng.normal(size=(64, 7)), rng.normal(size=64), 0.1 * rng.normal(size=(64, P)))
    return model.eval()


def _zero_aux_head(model: WorldModel, mean, std) -> WorldModel:
    """The head predicts 0 in standardized units (= aux_mean) whatever the latent; statistics set by hand."""
    with torch.no_grad():
        model.aux_head[-1].weight.zero_()
        model.aux_head[-1].bias.zero_()
        model.aux_mean.copy_(torch.tensor(mean))
        model.aux_std.copy_(torch.tensor(std))
    return model


@torch.no_grad()
def test_aux_loss_hand_computed():
    # P = 2, aux_mean 0, aux_std (0.5, 2); the head predicts 0, so each frame's error is mean((label / std)^2):
    #   frame 0 ( 0.5,  2) -> ( 1, 1) -> (1 + 1) / 2 = 1      (aux_recon)
    #   frame 1 ( 1.0,  0) -> ( 2, 0) -> (4 + 0) / 2 = 2
    #   frame 2 (-0.5,  4) -> (-1, 2) -> (1 + 4) / 2 = 2.5
    # w = mask x 0.9^t = (1, 0.9): aux_pred = (2 x 1 + 2.5 x 0.9) / 1.9 = 4.25 / 1.9
    torch.manual_seed(0)
    model = WorldModel(tiny_cfg(), state_dim=7, action_dim=4, control_hz=10.0, aux_dim=2)
    _zero_aux_head(model, [0.0, 0.0], [0.5, 2.0])
    labels = torch.tensor([[[0.5, 2.0], [1.0, 0.0], [-0.5, 4.0]]])
    w = torch.tensor([[1.0, 0.9]])
    parts = aux_loss(model, torch.randn(1, 3, model.z_dim), {"aux": labels}, w)
    assert float(parts["aux_recon"]) == pytest.approx(1.0)
    assert float(parts["aux_pred"]) == pytest.approx(4.25 / 1.9)
    # a padded transition (mask 0) does not count: only frame 1
    assert float(aux_loss(model, torch.randn(1, 3, model.z_dim), {"aux": labels},
                          torch.tensor([[1.0, 0.0]]))["aux_pred"]) == pytest.approx(2.0)


def test_sequence_loss_adds_the_weighted_aux_terms():
    model = aux_model()
    _zero_aux_head(model, [0.0] * P, [0.5] * P)
    ep = from_episode(aux_episode(2, 0), model.cameras)
    ep.aux[:] = 0.5  # every label 1 standardized: error 1 on every frame
    batch = to_tensors(make_windows([(ep, 0)], 2))
    total1, parts = sequence_loss(model, batch)
    assert parts["aux_recon"] == pytest.approx(1.0) and parts["aux_pred"] == pytest.approx(1.0)
    model.cfg = dataclasses.replace(model.cfg, aux_weight=3.0)
    total3, _ = sequence_loss(model, batch)
    assert float((total3 - total1).detach()) == pytest.approx(2.0 * (1.0 + 1.0), rel=1e-4)
    with pytest.raises(ValueError, match="frames/aux"):  # a model with a head never trains on missing labels
        sequence_loss(model, {k: v for k, v in batch.items() if k != "aux"})


def test_a_tiny_model_learns_the_aux_labels():
    trainer = WorldModelTrainer.create(tiny_cfg(lr=3e-3), state_dim=7, action_dim=4, control_hz=10.0, aux_dim=P)
    assert trainer.add_episodes([aux_episode(8, k) for k in range(4)]) == 4
    first = trainer.train_steps(3)
    assert {"wm/loss/aux_recon", "wm/loss/aux_pred"} <= set(first)
    for _ in range(8):
        last = trainer.train_steps(5)
    before = first["wm/loss/aux_recon"] + first["wm/loss/aux_pred"]
    assert last["wm/loss/aux_recon"] + last["wm/loss/aux_pred"] < 0.5 * before
    # without a head the labels are ignored and no aux loss is reported
    plain = WorldModelTrainer.create(tiny_cfg(), state_dim=7, action_dim=4, control_hz=10.0)
    plain.add_episodes([aux_episode(4, 0)])
    assert not any("aux" in k for k in plain.train_steps(1))


def test_a_model_with_an_aux_head_refuses_episodes_without_labels():
    trainer = WorldModelTrainer.create(tiny_cfg(), state_dim=7, action_dim=4, control_hz=10.0, aux_dim=P)
    with pytest.raises(ValueError, match="no obs\\['aux'\\]"):
        trainer.add_episodes([fake_episode(4, 0)])
    assert len(trainer.buffer) == 0 and not bool(trainer.model.stats_ready)


def test_imagined_env_emits_aux_only_with_a_head():
    episodes = [aux_episode(6, k, task_id=k) for k in range(3)]
    model = aux_model()
    env = ImaginedEnv(model, 3, start_episodes=episodes, horizon=2)
    obs = env.reset()
    assert obs[AUX_KEY].dtype == np.float32 and obs[AUX_KEY].shape == (3, P)
    with torch.no_grad():  # the start frame's labels come from the head too, from the encoded real frame
        z = model.encode({k: obs[k] for k in ("image/front", "state", "instruction")})
        np.testing.assert_allclose(obs[AUX_KEY], model.aux(z).numpy(), atol=1e-5)
    step = env.step(np.full((3, 4), 0.5, np.float32))
    assert step.obs[AUX_KEY].shape == (3, P) and np.isfinite(step.obs[AUX_KEY]).all()
    assert not np.allclose(step.obs[AUX_KEY], obs[AUX_KEY])  # predicted from the moved latent
    step = env.step(np.zeros((3, 4), np.float32))  # horizon 2: every branch ends, final rows carry aux too
    assert all(row[AUX_KEY].shape == (P,) and row[AUX_KEY].dtype == np.float32 for row in step.final_obs.values())
    assert AUX_KEY not in ImaginedEnv(tiny_model(), 2, start_episodes=episodes).reset()
    # like a sim env built without aux labels (a run with the default critic): no obs["aux"] even with a head
    quiet = ImaginedEnv(model, 2, start_episodes=episodes, horizon=1, aux_labels=False)
    assert AUX_KEY not in quiet.reset() and AUX_KEY not in quiet.step(np.zeros((2, 4), np.float32)).obs
    assert all(AUX_KEY not in row for row in quiet.step(np.zeros((2, 4), np.float32)).final_obs.values())
    with pytest.raises(ValueError, match="aux head"):
        ImaginedEnv(tiny_model(), 2, aux_labels=True)


def test_a_saved_model_keeps_its_aux_head(tmp_path):
    model = aux_model()
    model.save(tmp_path / "wm.pt")
    loaded = WorldModel.load(tmp_path / "wm.pt")
    assert loaded.aux_dim == P and loaded.describe()["aux_dim"] == P
    assert loaded.normalization() == model.normalization()
    z = torch.randn(2, model.z_dim)
    with torch.no_grad():
        assert torch.equal(loaded.aux(z), model.aux(z))
    copy = WorldModel.from_state(model.describe(), 3, model.state_dict())  # a publication to another process
    assert copy.aux_dim == P
    # a checkpoint written before aux_dim existed loads as a model without a head
    tiny_model().save(tmp_path / "old.pt")
    payload = torch.load(tmp_path / "old.pt", weights_only=True)
    del payload["aux_dim"]
    torch.save(payload, tmp_path / "old.pt")
    old = WorldModel.load(tmp_path / "old.pt")
    assert old.aux_dim == 0 and not hasattr(old, "aux_head")
    with pytest.raises(RuntimeError, match="no aux head"):
        old.aux(z)


def test_wm_eval_reports_aux_rmse_per_horizon():
    episodes = [from_episode(aux_episode(18, k), ("front",)) for k in range(2)]
    results = evaluate_episodes(aux_model(), episodes, start_stride=4)
    for h in ("1", "4", "16"):
        assert results["horizons"][h]["aux_rmse"] > 0
    assert "aux RMSE" in format_eval({**results, "wm_version": 0, "held_out": "test"})
    plain = evaluate_episodes(tiny_model(), episodes, start_stride=4)
    assert "aux_rmse" not in plain["horizons"]["1"]
    assert "aux RMSE" not in format_eval({**plain, "wm_version": 0, "held_out": "test"})


def test_pretraining_on_a_store_with_aux_labels_gives_an_aux_head(tmp_path, capsys):
    from acce.collect import collect
    from acce.config import CollectConfig
    from acce.store.episodes import EpisodeStore
    from acce.wiring import make_sim_env, sim_aux_dim
    from worldmodel.pretrain import pretrain
    path = tmp_path / "aux.zarr"
    store = EpisodeStore.create(path, image_shapes={"front": (32, 32)}, state_dim=7, action_dim=4, control_hz=10.0,
                                aux_dim=sim_aux_dim())
    collect(CollectConfig(tasks=("reach",), episodes=4, num_envs=2),
            lambda tasks, n, **kw: make_sim_env(tasks, n, image_size=32, aux_labels=True, **kw), store,
            progress=False)
    summary = pretrain(path, tmp_path / "out", tiny_cfg(val_fraction=0.25), steps=3, progress=False,
                       tensorboard=False)
    assert "aux_pred" in summary["val_loss_final"]
    assert WorldModel.load(tmp_path / "out").aux_dim == sim_aux_dim()
    assert "no aux labels" not in capsys.readouterr().out
