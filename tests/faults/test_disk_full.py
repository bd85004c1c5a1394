"""Fault injection: the disk fills up while an episode is appended to a store. There is no small filesystem to fill
on the CI machine, so ENOSPC is raised by zarr's own file writer after part of a chunk file was written, at every
write the append makes. The store must be byte-identical afterwards, and `acce collect` must say so in one line."""
import errno

import numpy as np
import pytest
import zarr.storage._local as zarr_local

from acce.store.episodes import EpisodeStore
from acce.types import Episode

SCHEMA = dict(image_shapes={"front": (16, 16)}, state_dim=4, action_dim=3, control_hz=10.0)


def _episode(rng: np.random.Generator, t: int) -> Episode:
    return Episode(
        obs={"image/front": rng.integers(0, 256, (t + 1, 16, 16, 3), dtype=np.uint8),
             "state": rng.standard_normal((t + 1, 4)).astype(np.float32)},
        action=rng.uniform(-1, 1, (t, 3)).astype(np.float32), reward=rng.standard_normal(t).astype(np.float32),
        terminated=np.zeros(t, bool), truncated=np.arange(t) == t - 1, success=np.zeros(t, bool),
        behavior_version=np.full(t, -1), delay_steps=np.zeros(t, np.int32), policy_sampled=np.zeros(t, bool),
        timestamp_s=np.arange(t + 1, dtype=np.float64), instruction="pick the red cube", task="pick", task_id=0,
        source="sim", seed=int(rng.integers(1 << 30)), episode_id=f"ep-{rng.integers(1 << 30)}", wm_version=-1)


def _files(path) -> dict:
    return {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def _fill_disk_at(monkeypatch, n: int) -> list:
    """Make the n-th file zarr writes from now on fail with ENOSPC after 7 bytes (its partial file stays behind
    for zarr to clean up, as a real full disk leaves it)."""
    real, calls = zarr_local._put, []

    def put(path, value, exclusive=False):
        calls.append(path)
        if len(calls) == n:
            path.parent.mkdir(parents=True, exist_ok=True)  # as zarr's writer does (a new chunk's folder)
            with zarr_local._atomic_write(path, "wb", exclusive=exclusive) as f:
                f.write(b"partial")
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, value, exclusive=exclusive)
    monkeypatch.setattr(zarr_local, "_put", put)
    return calls


def test_disk_full_at_any_write_of_an_append_leaves_the_store_byte_identical(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    path = tmp_path / "s.zarr"
    stored = [_episode(rng, 30) for _ in range(3)]  # 93 frame rows: the next append fills a chunk and starts another
    EpisodeStore.create(path, **SCHEMA).append_many(stored)
    writes = _fill_disk_at(monkeypatch, 0)  # never fails: count the files one append writes
    EpisodeStore.open(path, mode="a").append(_episode(rng, 80))
    monkeypatch.undo()
    n_writes = len(writes)
    assert n_writes >= 10  # image, state and episode chunks, array metadata, the commit
    for path_i, n in enumerate(range(1, n_writes + 1)):
        store_path = tmp_path / f"s{path_i}.zarr"
        EpisodeStore.create(store_path, **SCHEMA).append_many(stored)
        before = _files(store_path)
        store = EpisodeStore.open(store_path, mode="a")
        _fill_disk_at(monkeypatch, n)
        with pytest.raises(OSError) as failed:
            store.append(_episode(rng, 80))
        monkeypatch.undo()
        assert failed.value.errno == errno.ENOSPC and "the store is unchanged" in str(failed.value), f"write {n}"
        assert _files(store_path) == before, f"disk full at write {n} of {n_writes} changed the store"
        assert len(EpisodeStore.open(store_path)) == 3
        assert store.append(_episode(rng, 5)) == 3, f"write {n}: the store no longer appends once there is room"


def test_collect_onto_a_store_when_the_disk_fills_up_says_it_in_one_line(tmp_path, monkeypatch, capsys):
    from acce import cli
    out = tmp_path / "demos.zarr"
    assert cli.main(["collect", "--task", "reach", "--episodes", "2", "--out", str(out)]) == 0
    before = _files(out)
    _fill_disk_at(monkeypatch, 5)
    capsys.readouterr()
    assert cli.main(["collect", "--task", "reach", "--episodes", "2", "--out", str(out)]) == 1
    monkeypatch.undo()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("collect:")]
    assert len(err) == 1 and err[0].startswith(f"acce collect: error: no space left on the device while appending to "
                                               f"{out}; the store is unchanged"), err
    assert _files(out) == before and len(EpisodeStore.open(out)) == 2
