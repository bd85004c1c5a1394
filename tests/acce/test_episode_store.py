"""EpisodeStore: round trip, reopen, interrupted appends, corruption and schema errors (acce/store/episodes.py)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zarr

from acce.store.episodes import EpisodeStore, StoreError
from acce.store.integrity import Journal
from acce.types import Episode

SCHEMA = dict(image_shapes={"front": (16, 16), "wrist": (8, 12)}, state_dim=4, action_dim=3, control_hz=10.0)


def make_episode(rng: np.random.Generator, t: int, *, task: str = "pick", success_at: int | None = None,
                 image_shapes=SCHEMA["image_shapes"], state_dim: int = 4, action_dim: int = 3) -> Episode:
    """A random but valid episode with T = t transitions (success from step `success_at` on, if given)."""
    success = np.zeros(t, bool)
    if success_at is not None:
        success[success_at:] = True
    return Episode(
        obs={**{f"image/{cam}": rng.integers(0, 256, (t + 1, h, w, 3), dtype=np.uint8)
                for cam, (h, w) in image_shapes.items()},
             "state": rng.standard_normal((t + 1, state_dim)).astype(np.float32)},
        action=rng.uniform(-1, 1, (t, action_dim)).astype(np.float32),
        reward=rng.standard_normal(t).astype(np.float32),
        terminated=success.copy(), truncated=np.arange(t) == t - 1, success=success,
        behavior_version=rng.integers(-1, 50, t), delay_steps=rng.integers(0, 4, t).astype(np.int32),
        policy_sampled=rng.random(t) < 0.8, timestamp_s=1.7e9 + np.cumsum(rng.random(t + 1)),
        instruction=f"{task} the red cube ✓", task=task, task_id=hash(task) % 7, source="sim",
        seed=int(rng.integers(1 << 40)), episode_id=f"ep-{rng.integers(1 << 30)}", wm_version=int(rng.integers(-1, 3)),
    )


def assert_episode_equal(a: Episode, b: Episode) -> None:
    assert sorted(a.obs) == sorted(b.obs)
    for key in a.obs:
        assert a.obs[key].dtype == b.obs[key].dtype and np.array_equal(a.obs[key], b.obs[key]), key
    for name in ("action", "reward", "terminated", "truncated", "success", "behavior_version", "delay_steps",
                 "policy_sampled", "timestamp_s"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    for name in ("instruction", "task", "task_id", "source", "seed", "episode_id", "wm_version"):
        assert getattr(a, name) == getattr(b, name), name


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def test_round_trip_every_field(tmp_path, rng):
    store = EpisodeStore.create(tmp_path / "s.zarr", **SCHEMA, extra={"robot": "sim-arm"})
    episodes = [make_episode(rng, t) for t in (5, 0, 70)]  # 70 + 1 frames cross an image chunk boundary
    assert store.append_many(episodes) == [0, 1, 2]
    reopened = EpisodeStore.open(tmp_path / "s.zarr")
    for s in (store, reopened):
        assert len(s) == 3 and s.num_frames == 6 + 1 + 71
        for ep, got in zip(episodes, s.iter_episodes()):
            assert_episode_equal(ep, got)
        assert_episode_equal(episodes[-1], s[-1])
    assert reopened.meta == {"image_shapes": {"front": [16, 16], "wrist": [8, 12]}, "state_dim": 4, "action_dim": 3,
                             "control_hz": 10.0, "extra": {"robot": "sim-arm"}, "aux_dim": 0}
    # Frame rows: the episode's last row pads the transition fields.
    start, stop = reopened.frame_range(0)
    assert (start, stop) == (0, 6)
    assert np.array_equal(reopened.frames("action", start, stop)[-1], np.zeros(3, np.float32))
    assert reopened.frames("behavior_version", 5, 6)[0] == -1
    assert np.array_equal(reopened.frames("image/front", 6, 7)[0], episodes[1].obs["image/front"][0])
    assert reopened.frames("state", 70, 10_000).shape == (78 - 70, 4)
    with pytest.raises(KeyError, match="image/front"):
        reopened.frames("image/back")
    with pytest.raises(IndexError):
        reopened[3]


def test_append_after_reopen_and_read_only(tmp_path, rng):
    path = tmp_path / "s.zarr"
    first, second = make_episode(rng, 4), make_episode(rng, 9)
    EpisodeStore.create(path, **SCHEMA).append(first)
    with pytest.raises(StoreError, match="read-only"):
        EpisodeStore.open(path).append(second)
    store = EpisodeStore.open_or_create(path, **SCHEMA)
    assert store.append(second) == 1
    reader = EpisodeStore.open(path)
    assert len(reader) == 2 and reader.frame_range(1) == (5, 15)
    assert_episode_equal(second, reader[1])


def test_reader_sees_new_episodes_after_refresh(tmp_path, rng):
    writer = EpisodeStore.create(tmp_path / "s.zarr", **SCHEMA)
    reader = EpisodeStore.open(tmp_path / "s.zarr")
    episode = make_episode(rng, 3)
    writer.append(episode)
    assert len(reader) == 0  # a snapshot as of open
    reader.refresh()
    assert len(reader) == 1 and reader.num_frames == 4
    assert_episode_equal(episode, reader[0])


def test_interrupted_append_is_ignored_and_overwritten(tmp_path, rng):
    path = tmp_path / "s.zarr"
    store = EpisodeStore.create(path, **SCHEMA)
    store.append(make_episode(rng, 3))
    # Simulate a crash after the frame rows (and some episode rows) of a 30-step episode were written.
    root = zarr.open_group(path, mode="r+")
    for name in ("image/front", "state", "action", "reward"):
        arr = root[f"frames/{name}"]
        arr.resize((4 + 31, *arr.shape[1:]))
        arr[4:] = 7
    root["episodes/num_steps"].resize((2,))
    root["episodes/num_steps"][1] = 30
    reopened = EpisodeStore.open(path, mode="a")
    assert len(reopened) == 1 and reopened.num_frames == 4
    assert reopened.frames("state").shape == (4, 4)
    shorter = make_episode(rng, 2)
    assert reopened.append(shorter) == 1
    final = EpisodeStore.open(path)
    assert len(final) == 2 and final.num_frames == 7
    assert root["frames/state"].shape[0] >= 7  # rows past the commit point may stay on disk (spare capacity)...
    assert final.frames("state", 0, 10_000).shape == (7, 4)  # ...but are never read
    assert_episode_equal(shorter, final[1])


def committed_arrays(path) -> dict[str, np.ndarray]:
    """Every committed row of every frames/ and episodes/ array, read straight from zarr."""
    root = zarr.open_group(path, mode="r")
    n, f = root.attrs["num_episodes"], root.attrs["num_frames"]
    out = {f"frames/{k}": np.asarray(v[:f]) for k, v in root["frames"].arrays()}
    out.update({f"frames/image/{k}": np.asarray(v[:f]) for k, v in root["frames/image"].arrays()})
    out.update({f"episodes/{k}": np.asarray(v[:n]) for k, v in root["episodes"].arrays()})
    return out


def test_append_many_equals_appending_one_by_one(tmp_path, rng):
    first = make_episode(rng, 2)
    batch = [make_episode(rng, t, task=task, success_at=s)
             for t, task, s in ((5, "pick", 3), (0, "place", None), (70, "pick", None), (9, "stack", 0))]
    one = EpisodeStore.create(tmp_path / "one.zarr", **SCHEMA)
    many = EpisodeStore.create(tmp_path / "many.zarr", **SCHEMA)
    assert [one.append(e) for e in [first, *batch]] == [0, 1, 2, 3, 4]
    assert many.append_many([first]) == [0] and many.append_many(batch) == [1, 2, 3, 4]
    assert many.append_many([]) == []
    for store in (many, EpisodeStore.open(tmp_path / "many.zarr")):
        assert len(store) == len(one) == 5 and store.num_frames == one.num_frames == 3 + 6 + 1 + 71 + 10
        assert store.summary() == one.summary()
        for i, expected in enumerate([first, *batch]):
            assert store.frame_range(i) == one.frame_range(i)
            assert_episode_equal(expected, store[i])
            assert_episode_equal(one[i], store[i])
    a, b = committed_arrays(tmp_path / "one.zarr"), committed_arrays(tmp_path / "many.zarr")
    assert sorted(a) == sorted(b) and len(a) == 12 + 10  # 12 frame arrays (2 cameras), 10 episode arrays
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


def test_invalid_episode_in_a_batch_writes_nothing(tmp_path, rng):
    path = tmp_path / "s.zarr"
    store = EpisodeStore.create(path, **SCHEMA)
    store.append(make_episode(rng, 3))
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    bad = make_episode(rng, 4, state_dim=5)
    with pytest.raises(ValueError, match="obs\\['state'\\]"):
        store.append_many([make_episode(rng, 2), bad, make_episode(rng, 6)])
    after = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert after == before
    assert len(store) == 1 and store.num_frames == 4 and len(EpisodeStore.open(path)) == 1
    good = make_episode(rng, 5)
    assert store.append_many([good]) == [1]
    assert_episode_equal(good, EpisodeStore.open(path)[1])


def test_interrupted_batch_is_invisible_and_overwritten(tmp_path, rng, monkeypatch):
    path = tmp_path / "s.zarr"
    store = EpisodeStore.create(path, **SCHEMA)
    kept = make_episode(rng, 3)
    store.append(kept)

    def crash(self, num_episodes, num_frames):
        raise KeyboardInterrupt("killed before the commit")

    monkeypatch.setattr(EpisodeStore, "_commit", crash)  # every row of the batch is written, the commit is not
    monkeypatch.setattr(Journal, "restore", lambda self: None)  # a kill runs no rollback: the rows stay on disk
    with pytest.raises(KeyboardInterrupt):
        store.append_many([make_episode(rng, 40), make_episode(rng, 30)])
    monkeypatch.undo()
    root = zarr.open_group(path, mode="r")
    assert root["frames/state"].shape[0] >= 4 + 41 + 31 and root["episodes/seed"].shape[0] >= 3  # rows on disk
    assert len(store) == 1 and store.num_frames == 4  # the writer's own view did not move either
    reopened = EpisodeStore.open(path, mode="a")
    assert len(reopened) == 1 and reopened.num_frames == 4
    assert reopened.frames("state", 0, 10_000).shape == (4, 4)
    assert_episode_equal(kept, reopened[0])
    replacement = [make_episode(rng, 2), make_episode(rng, 5)]
    assert reopened.append_many(replacement) == [1, 2]
    final = EpisodeStore.open(path)
    assert len(final) == 3 and final.num_frames == 4 + 3 + 6 and final.frame_range(2) == (7, 13)
    for expected, got in zip([kept, *replacement], final.iter_episodes()):
        assert_episode_equal(expected, got)


def test_truncate_moves_the_commit_point(tmp_path, rng):
    store = EpisodeStore.create(tmp_path / "s.zarr", **SCHEMA)
    episodes = [make_episode(rng, t) for t in (2, 3, 4)]
    store.append_many(episodes)
    store.truncate(1)
    assert len(store) == 1 and store.num_frames == 3
    store.append(episodes[2])
    reopened = EpisodeStore.open(tmp_path / "s.zarr")
    assert len(reopened) == 2 and reopened.frame_range(1) == (3, 8)
    assert_episode_equal(episodes[2], reopened[1])


@pytest.mark.parametrize("break_store, message", [
    (lambda root, path: shutil.rmtree(path / "frames" / "reward"), "array frames/reward is missing"),
    (lambda root, path: root.attrs.put({**root.attrs.asdict(), "format": "other"}), "not an acce episode store"),
    (lambda root, path: root["episodes/seed"].resize((1,)), "episodes/seed has 1 rows but the commit point says 2"),
    (lambda root, path: root.attrs.put({**root.attrs.asdict(), "num_frames": 8}), "do not tile"),
    (lambda root, path: root.attrs.put({**root.attrs.asdict(), "format_version": 2}), "format_version=2"),
])
def test_corrupt_store_raises_store_error(tmp_path, rng, break_store, message):
    path = tmp_path / "s.zarr"
    EpisodeStore.create(path, **SCHEMA).append_many([make_episode(rng, 3), make_episode(rng, 4)])
    break_store(zarr.open_group(path, mode="r+"), path)
    with pytest.raises(StoreError, match=message) as info:
        EpisodeStore.open(path)
    assert str(path) in str(info.value)


def test_non_store_paths(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hi")
    with pytest.raises(StoreError, match="not an acce episode store.*no zarr.json"):
        EpisodeStore.open(tmp_path / "notes")
    with pytest.raises(StoreError, match="not an acce episode store"):
        EpisodeStore.open_or_create(tmp_path / "notes", **SCHEMA)
    with pytest.raises(FileExistsError, match="not empty"):
        EpisodeStore.create(tmp_path / "notes", **SCHEMA)
    with pytest.raises(FileNotFoundError, match="EpisodeStore.create"):
        EpisodeStore.open(tmp_path / "missing")
    zarr.open_group(tmp_path / "plain.zarr", mode="w").attrs["hello"] = 1
    with pytest.raises(StoreError, match="format=None"):
        EpisodeStore.open(tmp_path / "plain.zarr")
    zarr.create_array(tmp_path / "array.zarr", shape=(3,), dtype="int8")
    with pytest.raises(StoreError, match="not an acce episode store"):
        EpisodeStore.open(tmp_path / "array.zarr")
    (tmp_path / "empty").mkdir()
    assert len(EpisodeStore.open_or_create(tmp_path / "empty", **SCHEMA)) == 0  # an empty dir is a fine new store


def test_schema_mismatch_writes_nothing(tmp_path, rng):
    path = tmp_path / "s.zarr"
    store = EpisodeStore.create(path, **SCHEMA)
    store.append(make_episode(rng, 3))
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    bad = [
        (make_episode(rng, 3, image_shapes={"front": (16, 16), "wrist": (8, 8)}), r"\(H, W\)"),
        (make_episode(rng, 3, image_shapes={"front": (16, 16)}), "obs keys"),
        (make_episode(rng, 3, state_dim=5), "obs\\['state'\\]"),
        (make_episode(rng, 3, action_dim=2), "action has shape"),
    ]
    bad_source = make_episode(rng, 3)
    bad_source.source = "dream"
    bad.append((bad_source, "source"))
    for episode, message in bad:
        with pytest.raises(ValueError, match=message):
            store.append(episode)
    with pytest.raises(ValueError, match="action has shape"):
        store.append_many([make_episode(rng, 2), bad[3][0]])  # checked up front: the good one is not written either
    after = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert after == before and len(EpisodeStore.open(path)) == 1
    with pytest.raises(ValueError, match="state_dim: store has 4, requested 6.*EpisodeStore.open"):
        EpisodeStore.open_or_create(path, **{**SCHEMA, "state_dim": 6})
    with pytest.raises(ValueError, match="extra"):
        EpisodeStore.open_or_create(path, **SCHEMA, extra={"robot": "other"})


def test_summary_on_hand_made_set(tmp_path, rng):
    store = EpisodeStore.create(tmp_path / "s.zarr", **SCHEMA)
    # pick: lengths 2, 4, 6 with 2 successes -> rate 2/3, mean length 4; place: length 3, no success.
    store.append_many([make_episode(rng, 2, task="pick", success_at=1), make_episode(rng, 4, task="pick"),
                       make_episode(rng, 6, task="pick", success_at=5), make_episode(rng, 3, task="place")])
    assert store.summary() == {
        "num_episodes": 4, "num_frames": 3 + 5 + 7 + 4,
        "tasks": {"pick": {"episodes": 3, "success_rate": pytest.approx(2 / 3), "mean_length": 4.0},
                  "place": {"episodes": 1, "success_rate": 0.0, "mean_length": 3.0}},
    }
    assert EpisodeStore.create(tmp_path / "e.zarr", **SCHEMA).summary() == {"num_episodes": 0, "num_frames": 0,
                                                                            "tasks": {}}


def test_layout_marker_and_string_arrays(tmp_path, rng):
    path = tmp_path / "s.zarr"
    EpisodeStore.create(path, **SCHEMA).append(make_episode(rng, 3))
    attrs = json.loads((path / "zarr.json").read_text())["attributes"]
    assert (attrs["format"], attrs["format_version"], attrs["num_episodes"], attrs["num_frames"]) == (
        "acce-episodes", 1, 1, 4)
    root = zarr.open_group(path, mode="r")
    assert root["frames/image/front"].chunks == (64, 16, 16, 3)
    assert root["episodes/instruction"][0] == "pick the red cube ✓"


def test_import_acce_store_does_not_import_lerobot():
    code = "import sys, acce, acce.store; assert 'lerobot' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_aux_labels_round_trip_and_must_match_the_schema(tmp_path, rng):
    ep = make_episode(rng, 4)
    ep.obs["aux"] = rng.standard_normal((5, 2)).astype(np.float32)
    store = EpisodeStore.create(tmp_path / "aux.zarr", **SCHEMA, aux_dim=2)
    store.append(ep)
    got = EpisodeStore.open(tmp_path / "aux.zarr")[0]
    assert_episode_equal(ep, got)
    assert EpisodeStore.open(tmp_path / "aux.zarr").meta["aux_dim"] == 2
    with pytest.raises(ValueError, match="aux labels need a store created with aux_dim"):
        EpisodeStore.create(tmp_path / "plain.zarr", **SCHEMA).append(ep)
    with pytest.raises(ValueError, match="aux labels need"):
        store.append(make_episode(rng, 3))  # a store with aux_dim needs them
    ep.obs["aux"] = np.zeros((5, 3), np.float32)
    with pytest.raises(ValueError, match=r"obs\['aux'\] has shape"):
        store.append(ep)
    assert len(EpisodeStore.open(tmp_path / "aux.zarr")) == 1  # nothing half-written
    with pytest.raises(ValueError, match="aux_dim: store has 2, requested 0"):
        EpisodeStore.open_or_create(tmp_path / "aux.zarr", **SCHEMA)


# --- leftovers of failed runs (damaged chunks and failed appends: test_episode_store_faults.py) ----------------
def test_empty_store_with_another_schema_is_replaced_and_said_so(tmp_path, rng, caplog):
    path = tmp_path / "demos.zarr"
    EpisodeStore.create(path, **SCHEMA)  # what a run that failed before its first episode used to leave
    with caplog.at_level("WARNING", logger="acce.store.episodes"):
        store = EpisodeStore.open_or_create(path, **{**SCHEMA, "state_dim": 6})
    assert store.schema.state_dim == 6 and len(store) == 0
    assert "is empty and has another schema (state_dim: store has 4, requested 6): replacing it" in caplog.text
    store.append(make_episode(rng, 2, state_dim=6))
    with pytest.raises(ValueError, match="different schema"):  # one with episodes is never replaced
        EpisodeStore.open_or_create(path, **SCHEMA)
    assert len(EpisodeStore.open(path)) == 1


def test_interrupted_create_is_replaced(tmp_path, caplog):
    path = tmp_path / "s.zarr"
    root = zarr.open_group(path, mode="w")  # create() was killed after the layout, before the marker
    root.create_group("frames").create_array("state", shape=(0, 4), dtype="float32")
    with pytest.raises(StoreError, match="interrupted"):
        EpisodeStore.open(path)
    with caplog.at_level("WARNING", logger="acce.store.episodes"):
        assert len(EpisodeStore.open_or_create(path, **SCHEMA)) == 0
    assert "interrupted create" in caplog.text
    foreign = tmp_path / "foreign.zarr"
    zarr.open_group(foreign, mode="w").attrs["owner"] = "someone else"
    with pytest.raises(StoreError, match="not an acce episode store"):
        EpisodeStore.open_or_create(foreign, **SCHEMA)


def test_store_created_by_a_failed_command_is_removed(tmp_path, rng):
    path = tmp_path / "new.zarr"
    with pytest.raises(RuntimeError, match="config error"):
        with EpisodeStore.open_or_create(path, **SCHEMA).removed_if_failed_empty():
            raise RuntimeError("config error after the store was made")
    assert not path.exists()
    given = tmp_path / "given"
    given.mkdir()
    with pytest.raises(KeyboardInterrupt):
        with EpisodeStore.open_or_create(given, **SCHEMA).removed_if_failed_empty():
            raise KeyboardInterrupt
    assert given.is_dir() and not any(given.iterdir())  # the caller's empty directory stays, empty
    kept = tmp_path / "kept.zarr"
    with pytest.raises(RuntimeError):
        with EpisodeStore.open_or_create(kept, **SCHEMA).removed_if_failed_empty() as store:
            store.append(make_episode(rng, 2))
            raise RuntimeError("failed after an episode")
    assert len(EpisodeStore.open(kept)) == 1  # episodes are never thrown away
    with pytest.raises(RuntimeError):
        with EpisodeStore.open_or_create(kept, **SCHEMA).removed_if_failed_empty():  # opened, not created here
            raise RuntimeError
    existing = EpisodeStore.create(tmp_path / "old.zarr", **SCHEMA).path
    with pytest.raises(RuntimeError):
        with EpisodeStore.open_or_create(existing, **SCHEMA).removed_if_failed_empty():
            raise RuntimeError
    assert kept.exists() and existing.exists()
