"""The console script end to end on tiny inputs (real MuJoCo, real zarr store)."""
import json

import numpy as np
import pytest

from acce.cli import main
from acce.store.episodes import EpisodeStore


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for sub in ("tasks", "collect", "bench"):
        assert sub in out


def test_tasks_json(capsys):
    assert main(["tasks", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["task"] for r in rows} >= {"reach", "push", "pick_place", "track"}
    assert all(r["train_instructions"] and r["heldout_instructions"] for r in rows)


def test_collect_writes_provenance_and_appends(tmp_path, capsys):
    out = tmp_path / "eps.zarr"
    args = ["collect", "--config", "configs/debug.yaml", "--task", "reach", "--task", "track", "--episodes", "4",
            "--out", str(out), "--seeds", "test"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "reach" in printed and "track" in printed and "success" in printed
    store = EpisodeStore.open(out)
    assert len(store) == 4
    for ep in store.iter_episodes():
        assert ep.source == "demo" and ep.is_success and ep.seed >= 1_000_000
        assert (ep.behavior_version == -1).all() and (ep.delay_steps == 0).all()
        assert ep.obs["image/front"].shape[1:] == (32, 32, 3)
        assert np.all(np.diff(ep.timestamp_s) >= 0)
        assert ep.terminated[-1] and not ep.terminated[:-1].any()
    assert main(args) == 0
    assert len(EpisodeStore.open(out)) == 8


@pytest.mark.parametrize("split, lo, hi", [("val", 1_000_000, 1_050_000), ("test", 1_050_000, 1_100_000)])
def test_collect_records_held_out_layouts_of_either_evaluation_split(tmp_path, split, lo, hi):
    out = tmp_path / f"{split}.zarr"
    assert main(["collect", "--config", "configs/debug.yaml", "--task", "reach", "--episodes", "2", "--out", str(out),
                 "--seeds", split]) == 0
    assert all(lo <= ep.seed < hi for ep in EpisodeStore.open(out).iter_episodes())


def test_collect_refuses_a_mismatched_store(tmp_path, capsys):
    out = tmp_path / "eps.zarr"
    assert main(["collect", "--config", "configs/debug.yaml", "--episodes", "1", "--out", str(out)]) == 0
    assert main(["collect", "--config", "configs/debug.yaml", "--episodes", "1", "--out", str(out),
                 "env.image_size=48"]) == 2
    assert "image_shapes" in capsys.readouterr().err
    assert len(EpisodeStore.open(out)) == 1


def test_config_error_is_one_line_exit_2(tmp_path, capsys):
    assert main(["collect", "--config", "configs/debug.yaml", "env.num_env=3"]) == 2
    assert "did you mean 'env.num_envs'" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_sim_writes_json(tmp_path):
    out = tmp_path / "sim.json"
    assert main(["bench", "sim", "--config", "configs/debug.yaml", "--out", str(out), "--workers", "1",
                 "--duration-s", "0.3"]) == 0
    result = json.loads(out.read_text())["result"]
    assert result["physics_steps_per_s"] > 1000 and result["render_fps_64"] > 10
    assert result["parallel"]["1"] > 0


def test_overrides_may_follow_the_flags(tmp_path):
    out = tmp_path / "eps.zarr"
    args = ["collect", "--config", "configs/debug.yaml", "--task", "reach", "--episodes", "1", "--out", str(out),
            "env.image_size=24"]
    assert main(args) == 0
    ep = next(EpisodeStore.open(out).iter_episodes())
    assert ep.obs["image/front"].shape[1:] == (24, 24, 3)


@pytest.mark.parametrize("argv", [["collect", "--no-such-flag"], ["bench", "throughput", "--duration-s", "1",
                                                                   "not_an_override"]])
def test_unknown_arguments_are_still_a_usage_error(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path / "x.json")])
    assert exc.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def _files(path) -> dict:
    return {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_collect_that_fails_leaves_no_store_and_the_retry_runs(tmp_path, capsys):
    out = tmp_path / "x.zarr"
    assert main(["collect", "--config", "configs/debug.yaml", "--task", "nope", "--out", str(out)]) == 2
    assert "unknown task(s) ['nope']" in capsys.readouterr().err and not out.exists()
    # a config error that only the recording envs see, after the store was made: the store goes again
    bad = ["collect", "--config", "configs/debug.yaml", "--episodes", "1", "--out", str(out)]
    assert main([*bad, "env.task_params={reach: {bogus: 1}}"]) == 2
    assert "bogus" in capsys.readouterr().err and not out.exists()
    assert main([*bad, "env.image_size=24"]) == 0 and len(EpisodeStore.open(out)) == 1


def test_collect_and_wm_pretrain_refuse_a_damaged_store_in_one_line(tmp_path, capsys):
    out = tmp_path / "eps.zarr"
    args = ["collect", "--config", "configs/debug.yaml", "--episodes", "1", "--out", str(out)]
    assert main(args) == 0
    chunk = out / "frames/image/front/c/0/0/0/0"
    data = chunk.read_bytes()
    capsys.readouterr()
    chunk.unlink()
    before = _files(out)
    for argv in (args, ["wm-pretrain", "--data", str(out), "--out", str(tmp_path / "wm"), "--steps", "1",
                        "--quiet"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{out} is corrupt: chunk file frames/image/front/c/0/0/0/0" in err
        assert "is missing" in err and _files(out) == before
    chunk.write_bytes(data[:len(data) // 2])
    before = _files(out)
    for argv in (args, ["wm-pretrain", "--data", str(out), "--out", str(tmp_path / "wm"), "--steps", "1",
                        "--quiet"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()  # refused on open: nothing recorded first (no progress bar)
        assert len(err.splitlines()) == 1 and "frames/image/front/c/0/0/0/0 cannot be decoded" in err
        assert _files(out) == before


def test_collect_takes_the_store_layout_from_the_task(tmp_path):
    """Meta-World's 4-d state at 80 Hz, not the tabletop's 7-d at 10 Hz (the layout used to be hard-coded)."""
    from acce.store.episodes import EpisodeStore
    out = tmp_path / "mw.zarr"
    assert main(["collect", "--config", "configs/debug.yaml", "--task", "metaworld/reach-v3", "--episodes", "1",
                 "--out", str(out), "collect.num_envs=1", "env.task_params={metaworld/reach-v3: {max_steps: 5}}",
                 "env.tasks=[metaworld/reach-v3]"]) == 0
    schema = EpisodeStore.open(out).schema
    assert (schema.state_dim, schema.action_dim, schema.control_hz) == (4, 4, 80.0)


def test_eval_checks_task_names_before_loading_anything(tmp_path, capsys):
    """`acce eval --task nope` answers at once (it used to load the checkpoint and a simulator first, 16 s)."""
    assert main(["eval", "--checkpoint", str(tmp_path / "no-such-run"), "--task", "nope"]) == 2
    assert "unknown task(s) ['nope']" in capsys.readouterr().err


def test_bench_wm_refuses_an_unknown_arm_before_any_work(tmp_path, capsys):
    code = main(["bench", "wm", "--config", "configs/bench_wm.yaml", "--arms", "pretrained,bogus", "--workdir",
                 str(tmp_path / "w"), "--out", str(tmp_path / "x.json")])
    assert code != 0 and "--arms 'pretrained,bogus': choose from model_free,online,pretrained" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "w" / "bc").exists()
