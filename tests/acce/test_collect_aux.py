"""`acce collect --aux-labels`: the store keeps the sim's privileged labels (frames/aux), and `acce wm-pretrain` on it
makes a world model with the aux head that a privileged critic needs for imagination (what `bench wm`'s pretrained
arm records and pretrains on)."""
import pytest

from acce.cli import main
from acce.config import load
from acce.configlib import ConfigError
from acce.store.episodes import EpisodeStore
from acce.types import AUX_KEY
from acce.wiring import check_world_model_aux, sim_aux_dim

TINY_WM = ["wm.image_size=32", "wm.latent_dim=32", "wm.instruction_dim=8", "wm.instruction_buckets=256",
           "wm.channels=8", "wm.hidden_dim=64", "wm.ensemble_size=3", "wm.batch_size=8", "wm.seq_len=4",
           "wm.horizon=6", "wm.val_fraction=0.25"]


def _collect(out, *flags):
    return main(["collect", "--config", "configs/debug.yaml", "--task", "reach", "--episodes", "4", "--num-envs", "2",
                 "--out", str(out), *flags])


def test_collect_records_aux_labels_and_wm_pretrain_gives_an_aux_head(tmp_path, capsys, torch_threads):
    from worldmodel.model import WorldModel
    data = tmp_path / "aux.zarr"
    assert _collect(data, "--aux-labels") == 0
    store = EpisodeStore.open(data)
    assert store.schema.aux_dim == sim_aux_dim() and len(store) == 4
    ep = store[0]
    assert ep.obs[AUX_KEY].shape == (ep.num_steps + 1, sim_aux_dim())
    capsys.readouterr()
    assert main(["wm-pretrain", "--data", str(data), "--out", str(tmp_path / "wm"), "--steps", "3", "--quiet",
                 *TINY_WM]) == 0
    assert "no aux labels" not in capsys.readouterr().out
    model = WorldModel.load(tmp_path / "wm")
    assert model.aux_dim == sim_aux_dim()
    # what a privileged critic checks before it imagines with the model (imagination.wm_init_from)
    check_world_model_aux(model.aux_dim, load("configs/bench_wm.yaml", []))


def test_without_the_flag_the_store_has_no_labels_and_a_privileged_critic_refuses_its_model(tmp_path, capsys,
                                                                                            torch_threads):
    from worldmodel.model import WorldModel
    data = tmp_path / "plain.zarr"
    assert _collect(data) == 0
    assert EpisodeStore.open(data).schema.aux_dim == 0 and AUX_KEY not in EpisodeStore.open(data)[0].obs
    assert main(["wm-pretrain", "--data", str(data), "--out", str(tmp_path / "wm"), "--steps", "2", "--quiet",
                 *TINY_WM]) == 0
    assert "acce collect --aux-labels" in capsys.readouterr().out  # the line says how to get labels
    with pytest.raises(ConfigError, match="--aux-labels"):
        check_world_model_aux(WorldModel.load(tmp_path / "wm").aux_dim, load("configs/bench_wm.yaml", []))
    # a store keeps one layout: labelled episodes are not appended to a store made without them
    assert _collect(data, "--aux-labels") != 0 and len(EpisodeStore.open(data)) == 4


def test_aux_labels_are_refused_for_a_task_the_sim_cannot_label():
    with pytest.raises(ConfigError, match="collect.aux_labels"):
        load(None, ["collect.tasks=[not_a_task]", "collect.aux_labels=true"])
