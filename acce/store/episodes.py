"""Append-only episode store on zarr v3 (docs/design.md §1, §3; the record type is `acce.types.Episode`).

On-disk layout (one directory)::

    <path>/zarr.json               root attrs: {"format": "acce-episodes", "format_version": 1, "schema": {...},
                                   "num_episodes": N, "num_frames": F}   <- N and F are the commit point
    <path>/frames/image/<camera>   (F', H, W, 3) uint8, chunks (64, H, W, 3)
    <path>/frames/state            (F', S) float32
    <path>/frames/aux              (F', P) float32, only when schema.aux_dim = P > 0 (privileged sim labels)
    <path>/frames/timestamp_s      (F',) float64
    <path>/frames/action           (F', A) float32
    <path>/frames/{reward (float32), terminated, truncated, success, policy_sampled (bool),
                   behavior_version (int64), delay_steps (int32)}   (F',)
    <path>/episodes/{frame_start, num_steps, task_id, seed, wm_version (int64), success (bool)}   (N',)
    <path>/episodes/{instruction, task, source, episode_id}   (N',) variable-length UTF-8 strings

F' >= F and N' >= N are capacities: an append that needs more rows resizes an array to at least double its length,
so most appends write without a resize. Only rows below the commit point are data; read through `EpisodeStore`
(or slice [:F] / [:N]), never by an array's full length.

Episode e owns frame rows [frame_start, frame_start + num_steps + 1): one row per observation, so observations,
timestamps and transition fields share one frame index. Row T (the final observation) has no transition; its
transition fields hold padding (action 0, reward 0, flags False, behavior_version -1, delay 0).

Strings are zarr v3 variable-length UTF-8 arrays. Measured with zarr 3.1.6 (local disk): one append costs
~2 ms per string array at any size, while a JSON list in the root attrs costs 4 ms at 1k episodes, 35 ms at 10k
and 330 ms at 100k (the whole list is rewritten on every commit).

Appends are crash-safe for one writer: `append_many` writes a batch's frame rows (one write per array, plus a
resize only when capacity runs out), then its episode rows, then commits once with a single atomic rewrite of the
root zarr.json (zarr's LocalStore writes to a temp file and renames). Rows beyond the committed counts (spare
capacity, an interrupted append) are ignored on open and overwritten by the next append. Measured (zarr 3.1.6,
local disk, one 64x64 camera, 7-frame episodes): one episode per commit costs ~28 ms; batches of 32 ~1.1 ms per
episode. `append(e)` is `append_many([e])`. Readers see the store as of `open`/`refresh()`.

Nothing lost, nothing silent (`acce.store.integrity`): an append that fails (an exception, Ctrl-C) puts back every
file it touched; one that is killed leaves only invisible rows. Every chunk under the commit point must be on disk
and decode: a missing or damaged chunk is a StoreError naming the file, never zeros (stores written before the
`all_chunks_stored` marker skipped all-fill chunks, so there only image and state chunks must be present).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import zarr

from acce.store.integrity import (DENSE_MARKER, WRITE_CONFIG, Journal, StoreError, check_present, check_tail,
                                  committed_episodes, only_metadata, read_rows)
from acce.store.integrity import corrupt as _corrupt
from acce.store.schema import EPISODE_NUMBERS, EPISODE_STRINGS, TRANSITION_FIELDS, StoreSchema
from acce.types import AUX_KEY, IMAGE_PREFIX, STATE_KEY, Episode

__all__ = ["EPISODE_NUMBERS", "EPISODE_STRINGS", "TRANSITION_FIELDS", "EpisodeStore", "StoreError", "StoreSchema"]

FORMAT = "acce-episodes"
FORMAT_VERSION = 1
IMAGE_CHUNK_FRAMES = 64
"""frames per image chunk: ~800 KB raw at 64x64x3, a good read size for world-model batches"""
ROW_CHUNK = 1024
"""rows per chunk of the small per-frame and per-episode arrays"""
LEGACY_DENSE = (STATE_KEY,)
"""frames/ arrays (besides images) whose chunks stores without DENSE_MARKER also always wrote: a chunk of all-zero
states (or all-black images) is not real data, whereas all-False flag chunks were legitimately skipped"""
logger = logging.getLogger(__name__)


def _not_a_store(path: Path, why: str) -> StoreError:
    return StoreError(f"{path} is not an acce episode store ({why}); pass a new or empty directory to "
                      "EpisodeStore.create, or the root directory of an existing store")


class EpisodeStore:
    """Episodes appended to and read from one zarr v3 directory; see the module docstring for the layout."""

    def __init__(self, path: Path, writable: bool) -> None:
        """Use `create`, `open` or `open_or_create`; this validates the store and loads its episode index."""
        self.path = path
        self._writable = writable
        self._created: str | None = None
        """set by create: "dir" (it made the directory) or "contents" (it filled an empty one)"""
        self.refresh()

    # --- construction -----------------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | os.PathLike, *, image_shapes: dict[str, tuple[int, int]], state_dim: int,
               action_dim: int, control_hz: float, extra: dict[str, Any] | None = None,
               aux_dim: int = 0, action_repr: str = "", max_step_m: float = 0.0, **units: Any) -> EpisodeStore:
        """Create an empty store at `path` (which must not exist or be an empty directory). For an env spec's
        episodes pass `**StoreSchema.fields_for(spec)`; `units`: StoreSchema's names and action units."""
        path = Path(path)
        schema = StoreSchema(image_shapes, state_dim, action_dim, control_hz, extra or {}, aux_dim, action_repr,
                             max_step_m, **units)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise FileExistsError(f"{path} already exists and is not empty; open an existing store with "
                                  "EpisodeStore.open(path, mode='a') or EpisodeStore.open_or_create, "
                                  "or pick a new path")
        created = "contents" if path.exists() else "dir"
        root = zarr.open_group(path, mode="w")
        frames, episodes = root.create_group("frames"), root.create_group("episodes")
        for name, (tail, dtype) in schema.frame_arrays().items():
            rows = IMAGE_CHUNK_FRAMES if len(tail) == 3 else ROW_CHUNK
            frames.create_array(name, shape=(0, *tail), dtype=dtype, chunks=(rows, *tail))
        for name, dtype in EPISODE_NUMBERS.items():
            episodes.create_array(name, shape=(0,), dtype=dtype, chunks=(ROW_CHUNK,))
        for name in EPISODE_STRINGS:
            episodes.create_array(name, shape=(0,), dtype=str, chunks=(ROW_CHUNK,))
        # The marker goes in last so that an interrupted create reads as "not a store", never as an empty store.
        root.attrs.put({"format": FORMAT, "format_version": FORMAT_VERSION, "schema": schema.to_json(),
                        "num_episodes": 0, "num_frames": 0, DENSE_MARKER: True})
        store = cls(path, writable=True)
        store._created = created
        return store

    @classmethod
    def open(cls, path: str | os.PathLike, mode: str = "r") -> EpisodeStore:
        """Open an existing store: mode "r" (read-only) or "a" (read and append)."""
        if mode not in ("r", "a"):
            raise ValueError(f"mode={mode!r}: use 'r' (read-only) or 'a' (append)")
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no episode store at {path}; create one with EpisodeStore.create "
                                    "or EpisodeStore.open_or_create")
        if not (path / "zarr.json").is_file():
            raise _not_a_store(path, "no zarr.json in it")
        return cls(path, writable=mode == "a")

    @classmethod
    def open_or_create(cls, path: str | os.PathLike, **schema: Any) -> EpisodeStore:
        """Open `path` for appending if it holds a store with this schema, else create it.

        `extra` is compared only when given: a caller that does not care about it can reopen any matching store.
        A store with no episodes and another schema, or what an interrupted create left (zarr metadata, no data),
        is replaced (logged): it holds nothing, and refusing it would block the corrected retry of a failed run.
        """
        path = Path(path)
        if not path.exists() or (path.is_dir() and not any(path.iterdir())):
            return cls.create(path, **schema)
        requested = StoreSchema(**{**schema, "extra": schema.get("extra") or {}})
        try:
            store = cls.open(path, mode="a")
        except StoreError:
            if not only_metadata(path):
                raise
            logger.warning("%s holds only zarr metadata (an interrupted create): replacing it with a new "
                           "episode store", path)
            return cls._replace(path, schema)
        problem = store.schema.mismatch(requested, compare_extra=schema.get("extra") is not None)
        if problem is not None and len(store) == 0:
            logger.warning("episode store %s is empty and has another schema (%s): replacing it", path, problem)
            return cls._replace(path, schema)
        if problem is not None:
            raise ValueError(f"episode store {path} has a different schema ({problem}); open it with "
                             "EpisodeStore.open(path, mode='a') to use its schema, or pass a new path")
        return store

    @classmethod
    def _replace(cls, path: Path, schema: dict[str, Any]) -> EpisodeStore:
        shutil.rmtree(path)
        return cls.create(path, **schema)

    @contextlib.contextmanager
    def removed_if_failed_empty(self) -> Iterator[EpisodeStore]:
        """Wrap a command's use of a store it may have created: if the body raises while the store this object
        created has no episodes, the store is removed, so the failed run leaves nothing to block its retry."""
        try:
            yield self
        except BaseException:
            if self._created and self._writable and committed_episodes(self.path) == 0:
                if self._created == "dir":
                    shutil.rmtree(self.path, ignore_errors=True)
                else:  # the caller passed an empty directory: leave it empty
                    for child in self.path.iterdir():
                        if child.is_dir():
                            shutil.rmtree(child)
                        else:
                            child.unlink()
            raise

    def refresh(self) -> None:
        """Re-read the commit point and the episode index (to see episodes appended by another process)."""
        try:  # reopened because zarr caches the group metadata, which holds the commit point
            self._root = zarr.open_group(self.path, mode="r+" if self._writable else "r")
        except (ValueError, TypeError, KeyError, zarr.errors.BaseZarrError) as err:
            raise _not_a_store(self.path, f"zarr cannot open it as a group: {err}") from None
        attrs = self._root.attrs.asdict()
        if attrs.get("format") != FORMAT:
            raise _not_a_store(self.path, f"root attrs have format={attrs.get('format')!r}, expected {FORMAT!r}; "
                                          "a store whose create was interrupted also looks like this")
        if attrs.get("format_version") != FORMAT_VERSION:
            raise StoreError(f"episode store {self.path} has format_version={attrs.get('format_version')!r}; this "
                             f"acce reads version {FORMAT_VERSION}: use the acce version that wrote it")
        try:
            self.schema = StoreSchema.from_json(attrs["schema"])
            self._num_episodes, self._num_frames = int(attrs["num_episodes"]), int(attrs["num_frames"])
        except (KeyError, TypeError, ValueError) as err:
            raise _corrupt(self.path, f"root attrs lack a valid schema/num_episodes/num_frames ({err!r})") from None
        self._frames = self._arrays("frames", {k: (t, d) for k, (t, d) in self.schema.frame_arrays().items()},
                                    self._num_frames)
        episode_specs = {**{k: ((), d) for k, d in EPISODE_NUMBERS.items()}, **{k: ((), str) for k in EPISODE_STRINGS}}
        arrays = self._arrays("episodes", episode_specs, self._num_episodes)
        dense = bool(attrs.get(DENSE_MARKER))
        self._dense = {name: dense or name.startswith(IMAGE_PREFIX) or name in LEGACY_DENSE for name in self._frames}
        for name, arr in self._frames.items():  # a missing chunk is corruption, not zeros: refuse it on open
            if self._dense[name]:
                check_present(self.path, arr, 0, self._num_frames)
            if self._writable:
                check_tail(self.path, arr, self._num_frames)
        n = self._num_episodes
        self._dense.update({f"episodes/{name}": dense for name in arrays})
        rows = {k: read_rows(self.path, arr, 0, n, dense) for k, arr in arrays.items()}
        self._index = {k: rows[k] for k in EPISODE_NUMBERS}
        self._strings = {k: [str(s) for s in rows[k]] for k in EPISODE_STRINGS}
        self._episode_arrays = arrays
        starts = np.concatenate([[0], np.cumsum(self._index["num_steps"] + 1)])
        if not np.array_equal(starts[:-1], self._index["frame_start"]) or starts[-1] != self._num_frames:
            raise _corrupt(self.path, f"episodes/frame_start and num_steps do not tile the {self._num_frames} "
                                      "committed frame rows")

    def _arrays(self, group: str, specs: dict[str, tuple[tuple[int, ...], Any]], committed: int) -> dict[str, Any]:
        """Fetch a group's arrays, checking that each exists, has the schema's shape and covers `committed` rows."""
        out = {}
        for name, (tail, dtype) in specs.items():
            try:
                arr = self._root[f"{group}/{name}"]
            except KeyError:
                raise _corrupt(self.path, f"array {group}/{name} is missing") from None
            if not isinstance(arr, zarr.Array) or tuple(arr.shape[1:]) != tail:
                raise _corrupt(self.path, f"{group}/{name} should be an array of shape (n, *{tail}), "
                                          f"found {getattr(arr, 'shape', 'a group')}")
            if (dtype is str) != (arr.dtype.kind == "T") or (dtype is not str and arr.dtype != np.dtype(dtype)):
                expected = "a variable-length string" if dtype is str else np.dtype(dtype)
                raise _corrupt(self.path, f"{group}/{name} has dtype {arr.dtype}, expected {expected}")
            if arr.shape[0] < committed:
                raise _corrupt(self.path, f"{group}/{name} has {arr.shape[0]} rows but the commit point says "
                                          f"{committed}")
            out[name] = arr.with_config(WRITE_CONFIG) if self._writable else arr
        return out

    # --- reading --------------------------------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any]:
        """The schema as plain JSON data (image_shapes, state_dim, action_dim, control_hz, extra)."""
        return self.schema.to_json()

    @property
    def num_frames(self) -> int:
        """Committed frame rows: sum over episodes of T + 1."""
        return self._num_frames

    def __len__(self) -> int:
        return self._num_episodes

    def frame_range(self, i: int) -> tuple[int, int]:
        """[start, stop) frame rows of episode i (T + 1 rows)."""
        i = self._check_index(i)
        start = int(self._index["frame_start"][i])
        return start, start + int(self._index["num_steps"][i]) + 1

    def frames(self, key: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) of one frames/ array ("image/front", "state", "action", "reward", ...), committed only."""
        if key not in self._frames:
            raise KeyError(f"no frame array {key!r}; the store has {sorted(self._frames)}")
        stop = self._num_frames if stop is None else min(stop, self._num_frames)
        return read_rows(self.path, self._frames[key], start, max(start, stop), self._dense[key])

    def __getitem__(self, i: int) -> Episode:
        start, stop = self.frame_range(i)
        i = self._check_index(i)
        t = stop - start - 1
        rows = {name: self.frames(name, start, stop) for name in self._frames}
        return Episode(
            obs={k: rows[k] for k in self._frames if k.startswith(IMAGE_PREFIX) or k in (STATE_KEY, AUX_KEY)},
            action=rows["action"][:t], timestamp_s=rows["timestamp_s"],
            **{name: rows[name][:t] for name in TRANSITION_FIELDS},
            **{name: self._strings[name][i] for name in EPISODE_STRINGS},
            task_id=int(self._index["task_id"][i]), seed=int(self._index["seed"][i]),
            wm_version=int(self._index["wm_version"][i]),
        )

    def iter_episodes(self) -> Iterator[Episode]:
        for i in range(len(self)):
            yield self[i]

    def summary(self) -> dict[str, Any]:
        """{"num_episodes", "num_frames", "tasks": {task: {"episodes", "success_rate", "mean_length"}}}."""
        tasks: dict[str, dict[str, Any]] = {}
        names = np.asarray(self._strings["task"], dtype=object)
        for task in sorted(set(self._strings["task"])):
            mask = names == task
            tasks[task] = {"episodes": int(mask.sum()),
                           "success_rate": float(self._index["success"][mask].mean()),
                           "mean_length": float(self._index["num_steps"][mask].mean())}
        return {"num_episodes": len(self), "num_frames": self.num_frames, "tasks": tasks}

    def _check_index(self, i: int) -> int:
        n = self._num_episodes
        if not -n <= i < n:
            raise IndexError(f"episode {i} out of range for a store with {n} episodes")
        return i % n

    # --- writing --------------------------------------------------------------------------------------------
    def append(self, episode: Episode) -> int:
        """Validate, write and commit one episode; returns its index. Nothing is written if it is invalid."""
        return self.append_many([episode])[0]

    def append_many(self, episodes: Sequence[Episode]) -> list[int]:
        """Validate every episode, then write them all and commit once; returns their indices, in order.

        Nothing is written if any episode is invalid. The batch costs one write per array (plus a resize when an
        array's capacity runs out) and one commit, so batching amortizes the fixed per-commit cost over episodes.
        """
        self._check_writable()
        episodes = list(episodes)
        rows = [self.schema.frame_rows(episode) for episode in episodes]
        if not episodes:
            return []
        f, n = self._num_frames, self._num_episodes
        lengths = np.array([episode.num_steps + 1 for episode in episodes], np.int64)
        new_f, new_n = f + int(lengths.sum()), n + len(episodes)
        numbers = {"frame_start": f + np.cumsum(lengths) - lengths, "num_steps": lengths - 1,
                   "task_id": [e.task_id for e in episodes], "seed": [e.seed for e in episodes],
                   "wm_version": [e.wm_version for e in episodes], "success": [e.is_success for e in episodes]}
        numbers = {name: np.asarray(numbers[name], dtype) for name, dtype in EPISODE_NUMBERS.items()}
        strings = {name: [getattr(e, name) for e in episodes] for name in EPISODE_STRINGS}
        spans = [(arr, f, new_f, self._dense[name]) for name, arr in self._frames.items()]
        spans += [(arr, n, new_n, self._dense[f"episodes/{name}"]) for name, arr in self._episode_arrays.items()]
        journal = Journal(self.path, spans)  # nothing is written before this (it also checks the tail chunks exist)
        try:
            # Frame rows first, then episode rows: all past the commit point, so invisible until the commit lands.
            for name, arr in self._frames.items():
                self._write_rows(arr, f, np.concatenate([r[name] for r in rows]))
            for name, values in numbers.items():
                self._write_rows(self._episode_arrays[name], n, values)
            for name, values in strings.items():
                self._write_rows(self._episode_arrays[name], n, np.array(values, dtype=object))
            self._commit(new_n, new_f)
        except BaseException as err:
            journal.restore()
            self._reopen_arrays()  # zarr caches each array's metadata: drop the shapes the failed resizes set
            found = journal.diagnose({a.path: a for a in [*self._frames.values(), *self._episode_arrays.values()]})
            if found is not None and isinstance(err, Exception):
                raise found from None
            if isinstance(err, OSError) and err.errno == errno.ENOSPC:
                raise OSError(errno.ENOSPC, f"no space left on the device while appending to {self.path}; the store "
                                            "is unchanged (free some space and run again)") from err
            raise
        for name, values in numbers.items():
            self._index[name] = np.concatenate([self._index[name], values])
        for name, values in strings.items():
            self._strings[name].extend(values)
        return list(range(n, new_n))

    def truncate(self, num_episodes: int) -> None:
        """Keep only the first `num_episodes` episodes (undo appends, e.g. a failed import).

        Only the commit point moves; the dropped rows stay on disk until the next append overwrites them.
        """
        self._check_writable()
        if not 0 <= num_episodes <= len(self):
            raise ValueError(f"truncate({num_episodes}): the store has {len(self)} episodes")
        f = int(self._index["frame_start"][num_episodes]) if num_episodes < len(self) else self._num_frames
        self._commit(num_episodes, f)
        self._index = {k: v[:num_episodes] for k, v in self._index.items()}
        self._strings = {k: v[:num_episodes] for k, v in self._strings.items()}

    def _reopen_arrays(self) -> None:
        self._root = zarr.open_group(self.path, mode="r+")
        self._frames = {k: self._root[f"frames/{k}"].with_config(WRITE_CONFIG) for k in self._frames}
        self._episode_arrays = {k: self._root[f"episodes/{k}"].with_config(WRITE_CONFIG) for k in self._episode_arrays}

    def _commit(self, num_episodes: int, num_frames: int) -> None:
        """Move the commit point: one atomic rewrite of the root zarr.json (rows past it are invisible)."""
        self._root.attrs.put({**self._root.attrs.asdict(), "num_episodes": num_episodes, "num_frames": num_frames})
        self._num_episodes, self._num_frames = num_episodes, num_frames

    @staticmethod
    def _write_rows(arr: zarr.Array, start: int, data: np.ndarray) -> None:
        """Write `data` at rows [start, start + len), first growing the array to >= 2x its length if it is short."""
        stop = start + len(data)
        if arr.shape[0] < stop:  # geometric growth: ~25% faster batches, ~35% faster single appends (measured)
            arr.resize((max(stop, 2 * arr.shape[0]), *arr.shape[1:]))
        arr[start:stop] = data

    def _check_writable(self) -> None:
        if not self._writable:
            raise StoreError(f"episode store {self.path} is open read-only; use EpisodeStore.open(path, mode='a')")
