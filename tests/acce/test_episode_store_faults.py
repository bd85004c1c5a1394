"""Fault injection on the episode store: missing and damaged chunk files, appends that fail midway, and a disk that
fills up during an append (no small filesystem to fill on the CI machine, so ENOSPC is raised by zarr's own file
writer after part of a chunk file was written, at every write the append makes). Nothing may be read as zeros, and
a failed append leaves the store byte-identical."""
from __future__ import annotations

import errno

import pytest
import zarr
import zarr.storage._local as zarr_local

from acce.store.episodes import EpisodeStore, StoreError
from acce.types import Episode
from test_episode_store import SCHEMA, assert_episode_equal, make_episode, rng  # noqa: F401  (rng: the fixture)


def files_of(path) -> dict:
    """Every file under the store and its bytes: a failed append must leave this exactly as it was."""
    return {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def truncate_file(file) -> None:
    data = file.read_bytes()
    file.write_bytes(data[:len(data) // 2])


def stored_with_two_image_chunks(path, rng) -> list[Episode]:
    episodes = [make_episode(rng, 30) for _ in range(3)]  # 93 frame rows: image chunks 0 and 1 (64 rows each)
    EpisodeStore.create(path, **SCHEMA).append_many(episodes)
    return episodes


@pytest.mark.parametrize("chunk", ["frames/image/front/c/1/0/0/0", "frames/state/c/0/0",
                                   "frames/success/c/0", "episodes/task_id/c/0"])
def test_missing_chunk_is_corruption_not_zeros(tmp_path, rng, chunk):
    path = tmp_path / "s.zarr"
    stored_with_two_image_chunks(path, rng)
    (path / chunk).unlink()  # zarr alone would read black images / zero states / False flags here
    for mode in ("r", "a"):
        with pytest.raises(StoreError, match=f"{path}.*chunk file {chunk} .*is missing.*restore it from a copy"):
            EpisodeStore.open(path, mode=mode)


def test_chunk_deleted_after_open_fails_the_read_and_the_append(tmp_path, rng):
    path = tmp_path / "s.zarr"
    stored_with_two_image_chunks(path, rng)
    store = EpisodeStore.open(path, mode="a")
    (path / "frames/image/front/c/1/0/0/0").unlink()
    with pytest.raises(StoreError, match="frames/image/front/c/1/0/0/0 .*is missing"):
        store[2]
    before = files_of(path)
    with pytest.raises(StoreError, match="frames/image/front/c/1/0/0/0 .*is missing"):  # it shares that chunk
        store.append(make_episode(rng, 2))
    assert files_of(path) == before


def test_store_without_the_marker_allows_skipped_flag_chunks_only(tmp_path, rng):
    """Stores written before every chunk was stored skipped all-fill chunks (all-False flags): still readable."""
    path = tmp_path / "s.zarr"
    episodes = stored_with_two_image_chunks(path, rng)
    root = zarr.open_group(path, mode="r+")
    root.attrs.put({k: v for k, v in root.attrs.asdict().items() if k != "all_chunks_stored"})
    (path / "frames/terminated/c/0").unlink()
    for e in episodes:
        e.terminated[:] = False
    store = EpisodeStore.open(path, mode="a")
    assert_episode_equal(episodes[1], store[1])
    (path / "frames/state/c/0/0").unlink()  # an all-zero state chunk is never real data
    with pytest.raises(StoreError, match="frames/state/c/0/0 .*is missing"):
        EpisodeStore.open(path)


@pytest.mark.parametrize("chunk", ["frames/image/front/c/0/0/0/0", "frames/state/c/0/0"])
def test_truncated_frame_chunk_is_named_on_read(tmp_path, rng, chunk):
    path = tmp_path / "s.zarr"
    stored_with_two_image_chunks(path, rng)
    truncate_file(path / chunk)
    store = EpisodeStore.open(path)  # opening checks presence; decoding happens on read
    with pytest.raises(StoreError, match=f"{path} is corrupt: chunk file {chunk} cannot be decoded.*truncated"):
        store[0]
    with pytest.raises(StoreError, match=f"chunk file {chunk} cannot be decoded"):
        store.frames(chunk.split("/c/")[0].removeprefix("frames/"))


def test_truncated_episode_chunk_is_named_on_open(tmp_path, rng):
    path = tmp_path / "s.zarr"
    stored_with_two_image_chunks(path, rng)
    truncate_file(path / "episodes/instruction/c/0")
    with pytest.raises(StoreError, match="chunk file episodes/instruction/c/0 cannot be decoded"):
        EpisodeStore.open(path)


@pytest.mark.parametrize("chunk", ["frames/image/front/c/1/0/0/0", "frames/state/c/0/0"])
def test_append_onto_a_truncated_tail_chunk_changes_nothing(tmp_path, rng, chunk):
    path = tmp_path / "s.zarr"
    episodes = stored_with_two_image_chunks(path, rng)
    store = EpisodeStore.open(path, mode="a")
    intact = (path / chunk).read_bytes()
    truncate_file(path / chunk)  # the chunk the next rows are merged into
    before = files_of(path)
    with pytest.raises(StoreError, match=f"{path} is corrupt: chunk file {chunk} cannot be decoded"):
        store.append_many([make_episode(rng, 40), make_episode(rng, 5)])  # grows every frames/ array
    assert files_of(path) == before  # no array metadata and no chunk rewritten
    assert len(store) == 3 and store.num_frames == 93
    with pytest.raises(StoreError, match=f"chunk file {chunk} cannot be decoded"):
        EpisodeStore.open(path, mode="a")  # opening for appending checks that chunk up front
    assert len(EpisodeStore.open(path)) == 3  # reading the other episodes still works
    (path / chunk).write_bytes(intact)  # put back, the store reads exactly as before
    for e, got in zip(episodes, EpisodeStore.open(path).iter_episodes(), strict=True):
        assert_episode_equal(e, got)


@pytest.mark.parametrize("interrupt", [OSError("disk full"), KeyboardInterrupt()])
def test_append_failing_midway_restores_every_file(tmp_path, rng, monkeypatch, interrupt):
    path = tmp_path / "s.zarr"
    episodes = stored_with_two_image_chunks(path, rng)
    store = EpisodeStore.open(path, mode="a")
    before = files_of(path)
    real, calls = EpisodeStore._write_rows, []

    def fail_on_fourth(arr, start, data):  # the image arrays and the state array are resized and written
        calls.append(arr.path)
        if len(calls) == 4:
            raise interrupt
        real(arr, start, data)

    monkeypatch.setattr(EpisodeStore, "_write_rows", staticmethod(fail_on_fourth))
    with pytest.raises(type(interrupt)):
        store.append_many([make_episode(rng, 80), make_episode(rng, 3)])
    monkeypatch.undo()
    assert files_of(path) == before
    assert not [p for p in path.rglob("*") if p.is_dir() and not any(p.iterdir())]  # nor new empty chunk folders
    assert zarr.open_group(path, mode="r")["frames/image/front"].shape[0] == 93
    extra = make_episode(rng, 70)
    assert store.append(extra) == 3  # the same object appends correctly after the rollback
    final = EpisodeStore.open(path)
    for e, got in zip([*episodes, extra], final.iter_episodes()):
        assert_episode_equal(e, got)


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


def test_disk_full_at_any_write_of_an_append_leaves_the_store_byte_identical(tmp_path, rng, monkeypatch):
    path = tmp_path / "s.zarr"
    stored = [make_episode(rng, 30) for _ in range(3)]  # 93 frame rows: the next append fills a chunk and starts another
    EpisodeStore.create(path, **SCHEMA).append_many(stored)
    writes = _fill_disk_at(monkeypatch, 0)  # never fails: count the files one append writes
    EpisodeStore.open(path, mode="a").append(make_episode(rng, 80))
    monkeypatch.undo()
    n_writes = len(writes)
    assert n_writes >= 10  # image, state and episode chunks, array metadata, the commit
    for path_i, n in enumerate(range(1, n_writes + 1)):
        store_path = tmp_path / f"s{path_i}.zarr"
        EpisodeStore.create(store_path, **SCHEMA).append_many(stored)
        before = files_of(store_path)
        store = EpisodeStore.open(store_path, mode="a")
        _fill_disk_at(monkeypatch, n)
        with pytest.raises(OSError) as failed:
            store.append(make_episode(rng, 80))
        monkeypatch.undo()
        assert failed.value.errno == errno.ENOSPC and "the store is unchanged" in str(failed.value), f"write {n}"
        assert files_of(store_path) == before, f"disk full at write {n} of {n_writes} changed the store"
        assert len(EpisodeStore.open(store_path)) == 3
        assert store.append(make_episode(rng, 5)) == 3, f"write {n}: the store no longer appends once there is room"


def test_collect_onto_a_store_when_the_disk_fills_up_says_it_in_one_line(tmp_path, monkeypatch, capsys):
    from acce import cli
    out = tmp_path / "demos.zarr"
    assert cli.main(["collect", "--task", "reach", "--episodes", "2", "--out", str(out)]) == 0
    before = files_of(out)
    _fill_disk_at(monkeypatch, 5)
    capsys.readouterr()
    assert cli.main(["collect", "--task", "reach", "--episodes", "2", "--out", str(out)]) == 1
    monkeypatch.undo()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("collect:")]
    assert len(err) == 1 and err[0].startswith(f"acce collect: error: no space left on the device while appending to "
                                               f"{out}; the store is unchanged"), err
    assert files_of(out) == before and len(EpisodeStore.open(out)) == 2
