"""Chunk-level integrity of an episode store (used by `acce.store.episodes`).

zarr reads a chunk file that is not there as fill values (zeros, black images) and gives a bare codec error
(`RuntimeError: Zstd decompression error`) for a truncated one. zarr 3.1 has no option to raise on a missing chunk,
so the store checks chunk files itself: stores created with `DENSE_MARKER` write every chunk (zarr's
`write_empty_chunks`), which makes any missing chunk under the commit point corruption. Appends are journaled:
every file an append may change is saved first and put back if the append fails, so a failed append leaves the
store's files as they were; a chunk it could not decode is then named. (Decoding the tail chunks before every
append instead cost ~30% of a single append's time, measured: zarr decodes them during the write anyway.)
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np
import zarr

DENSE_MARKER = "all_chunks_stored"
"""root attr: every chunk under the commit point is on disk (older stores skipped chunks that held only fill)"""
WRITE_CONFIG = {"write_empty_chunks": True}
"""zarr array config for writers: store all-fill chunks too, so a missing chunk file always means corruption"""


class StoreError(ValueError):
    """The path is not a usable acce episode store (missing, foreign, corrupt, or opened read-only)."""


def corrupt(path: Path, what: str) -> StoreError:
    return StoreError(f"episode store {path} is corrupt: {what}. acce does not repair stores: restore it from a "
                      "copy, or record the data again into a new store")


def chunk_files(root: Path, arr: zarr.Array, start: int, stop: int) -> list[tuple[int, Path]]:
    """(first row, file) of each chunk holding rows [start, stop); acce chunks split only the row axis."""
    rows = arr.chunks[0]
    tail = (0,) * (arr.ndim - 1)
    return [(c * rows, root / arr.path / arr.metadata.encode_chunk_key((c, *tail)))
            for c in range(start // rows, -(-stop // rows))]


def check_present(root: Path, arr: zarr.Array, start: int, stop: int) -> None:
    """Raise StoreError naming the first chunk file of rows [start, stop) that is not on disk."""
    for first, file in chunk_files(root, arr, start, stop):
        if not file.is_file():
            raise corrupt(root, f"chunk file {file.relative_to(root)} (rows {first}-{first + arr.chunks[0] - 1} of "
                                f"{arr.path}) is missing, and zarr would read it as zeros")


def _decodes(arr: zarr.Array, first: int) -> BaseException | None:
    """The error decoding the chunk that starts at row `first`, or None if it decodes."""
    try:
        np.asarray(arr[first:min(first + arr.chunks[0], arr.shape[0])])
    except Exception as err:  # codecs raise RuntimeError, ValueError, ... for damaged bytes
        return err
    return None


def _undecodable(root: Path, file: Path, err: BaseException) -> StoreError:
    why = str(err).splitlines()[0] if str(err) else ""
    return corrupt(root, f"chunk file {file.relative_to(root)} cannot be decoded ({type(err).__name__}: {why}); "
                         "it is truncated or damaged")


def read_rows(root: Path, arr: zarr.Array, start: int, stop: int, dense: bool) -> np.ndarray:
    """Rows [start, stop) of `arr`; a missing (when `dense`) or undecodable chunk raises StoreError naming it."""
    if stop <= start:
        return np.asarray(arr[start:start])
    if dense:
        check_present(root, arr, start, stop)
    try:
        return np.asarray(arr[start:stop])
    except Exception:
        for first, file in chunk_files(root, arr, start, stop):  # find the chunk to name
            if file.is_file() and (chunk_err := _decodes(arr, first)) is not None:
                raise _undecodable(root, file, chunk_err) from None
        raise


def check_tail(root: Path, arr: zarr.Array, committed: int) -> None:
    """The chunk the next append merges new rows into (it holds the last committed rows) must decode: checked when
    a store is opened for appending, so a long recording fails before it starts rather than at its first write."""
    if committed % arr.chunks[0]:
        first, file = chunk_files(root, arr, committed - 1, committed)[0]
        if file.is_file() and (err := _decodes(arr, first)) is not None:
            raise _undecodable(root, file, err)


class Journal:
    """The bytes of every file an append may change (each array's zarr.json and the chunk files of the rows it
    writes), saved before the append so that `restore` can put the store back exactly as it was.

    spans: (array, first row the append writes = that array's committed rows, stop row, dense). Refuses
    (StoreError) when the chunk the append shares with committed rows is missing: zarr would merge into zeros.
    """

    def __init__(self, root: Path, spans: Iterable[tuple[zarr.Array, int, int, bool]]) -> None:
        self.root = root
        self.spans = list(spans)
        self.saved: dict[Path, bytes | None] = {}
        self.new_dirs: set[Path] = set()
        for arr, start, stop, dense in self.spans:
            base = root / arr.path
            chunks = chunk_files(root, arr, start, stop)
            if dense and chunks and chunks[0][0] < start and not chunks[0][1].is_file():
                check_present(root, arr, chunks[0][0], start)
            for file in [base / "zarr.json", *(f for _, f in chunks)]:
                self.saved[file] = file.read_bytes() if file.is_file() else None
                parent = file.parent
                while parent != base and not parent.exists():  # chunk directories the append will create
                    self.new_dirs.add(parent)
                    parent = parent.parent

    def restore(self, settle_s: float = 1.0) -> None:
        """Put every saved file back. zarr writes an array's chunks as concurrent tasks and the first failure does
        not cancel the others, so a chunk write can land after the failure reached us (a test caught a new chunk
        file left behind in about one run of three): repeat until three checks 20 ms apart find nothing to undo."""
        import time
        deadline, clean = time.monotonic() + settle_s, 0
        while clean < 3 and time.monotonic() < deadline:
            clean = 0 if self._restore_once() else clean + 1
            time.sleep(0.02)
        self._restore_once()
        for folder in sorted(self.new_dirs, key=lambda p: len(p.parts), reverse=True):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()

    def _restore_once(self) -> bool:
        """One pass; True if anything had to be undone."""
        changed = False
        for file, data in self.saved.items():
            if data is None:
                if file.is_file():
                    file.unlink(missing_ok=True)
                    changed = True
            elif not file.is_file() or file.read_bytes() != data:
                tmp = file.with_name(f".{file.name}.restore-{os.getpid()}")
                tmp.write_bytes(data)
                os.replace(tmp, file)  # atomic, like zarr's own writes
                changed = True
        return changed

    def diagnose(self, arrays: dict[str, zarr.Array]) -> StoreError | None:
        """After `restore`: the chunk the failed append could not decode (zarr merges new rows into existing
        chunks), as a StoreError naming its file; None when every chunk decodes (the failure was elsewhere).
        `arrays`: path -> the array reopened on the restored metadata."""
        for arr, start, stop, _ in self.spans:
            arr = arrays.get(arr.path, arr)
            for first, file in chunk_files(self.root, arr, start, stop):
                if first < arr.shape[0] and file.is_file() and (err := _decodes(arr, first)) is not None:
                    if first < start:
                        return _undecodable(self.root, file, err)
                    return corrupt(self.root, f"chunk file {file.relative_to(self.root)} (past the commit point: "
                                              "left by an interrupted append, no data) cannot be decoded; delete "
                                              "that file and append again")
        return None


def committed_episodes(path: Path) -> int:
    """Episodes committed on disk now (another writer may have appended since this object last looked)."""
    try:
        return int(zarr.open_group(path, mode="r").attrs.get("num_episodes", 0))
    except Exception:  # unreadable: treat as holding data, so nothing is removed
        return -1


def only_metadata(path: Path) -> bool:
    """`path` is what an interrupted `create` leaves: zarr metadata files only, and no root attrs yet."""
    try:
        attrs = json.loads((path / "zarr.json").read_text()).get("attributes")
    except (OSError, ValueError, AttributeError):
        return False
    return not attrs and all(p.name == "zarr.json" for p in path.rglob("*") if not p.is_dir())
