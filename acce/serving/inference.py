"""InferenceServer: batched policy inference with atomic, versioned weight swaps between batches.

Requests from several rollout workers (or robot clients) are merged into one forward pass: the batching thread
takes the first waiting request, then waits up to `timeout_ms` for more until `max_batch` rows. New weights are
staged by `load_weights` and applied by the same thread *between* batches, so no request ever runs on a
half-updated model (the swap and every forward pass happen on one thread, under one lock).
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from acce.bykey import ByKey
from acce.policy.frozen import frozen_stamp, is_frozen, shipped
from acce.types import INSTRUCTION_KEY


def _concat(batches: list[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in batches[0]:
        if key == INSTRUCTION_KEY:
            out[key] = [s for b in batches for s in b[key]]
        else:
            out[key] = np.concatenate([np.asarray(b[key]) for b in batches])
    return out


def _rows(batch: Mapping[str, Any]) -> int:
    return len(batch[INSTRUCTION_KEY])


@dataclass(frozen=True)
class ServerStats(ByKey):
    """An InferenceServer's counters since it started (a snapshot: `InferenceServer.stats`)."""
    batches: int = 0
    """forward passes run (one per merged batch)"""
    rows: int = 0
    """requests' rows over all forward passes (rows / batches: the mean batch size)"""
    forward_s: float = 0.0
    """seconds in forward passes, wall-clock"""
    swaps: int = 0
    """weight swaps applied (staged versions that reached a batch boundary)"""
    swap_ms_total: float = 0.0
    """milliseconds in weight swaps, summed"""
    swap_ms_last: float = 0.0
    """milliseconds of the last weight swap"""


class InferenceServer:
    """Owns one policy network. `infer` is the direct in-thread path; `submit` goes through dynamic batching.
    The policy runs where its owner placed it (acce.device.place: device and mixed precision)."""

    def __init__(self, policy, *, max_batch: int = 64, timeout_ms: float = 2.0, seed: int = 0,
                 deterministic: bool = False, name: str = "server", ship_features: bool = False):
        """ship_features: every result also carries the rows' frozen features ('frozen/KEY') and the policy's
        'frozen_stamp' (acce.policy.frozen; learner.train_scope=residual, whose learner then skips vision + trunk)."""
        import torch

        self.policy = policy.eval()
        self.max_batch, self.timeout_s = int(max_batch), float(timeout_ms) / 1000.0
        self.deterministic = deterministic
        self.name = name
        self._version = 0
        # sampling noise is drawn where the policy runs (a CPU generator cannot feed CUDA's randn)
        self.generator = torch.Generator(device=self.policy.device).manual_seed(int(seed))
        self._lock = threading.Lock()
        """held for a batch (forward pass) and the swap before it"""
        self._stage_lock = threading.Lock()
        """guards _staged and _version"""
        self._staged: tuple[int, Any] | None = None
        self.ship_features = bool(ship_features)
        self._stamp: str | None = None
        """frozen_stamp of the policy, computed when first needed and again after a swap that changed a frozen tensor"""
        self._requests: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._counts: dict[str, float] = asdict(ServerStats())
        """ServerStats' fields, counted in place by the batching thread"""

    @property
    def stats(self) -> ServerStats:
        """The counters so far, as a snapshot."""
        return ServerStats(**self._counts)

    # --- weights ------------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The version the next request will run on: the newest staged version (applied before the next batch),
        else the running one. Never waits for a running batch (workers ask before every gated decision)."""
        with self._stage_lock:
            return self._staged[0] if self._staged is not None else self._version

    def load_weights(self, version: int, state: Mapping[str, Any]) -> None:
        """Stage weights; they take effect at the next batch boundary (atomic for every request)."""
        with self._stage_lock:
            if version > self._version and (self._staged is None or version > self._staged[0]):
                self._staged = (int(version), state)

    def _apply_staged(self) -> None:
        """Called with the batch lock held, between batches only."""
        with self._stage_lock:  # version readers wait for the swap (a few ms), never for a batch
            self._swap_staged()

    def _swap_staged(self) -> None:
        if self._staged is None:
            return
        import torch

        version, state = self._staged
        t0 = time.perf_counter()
        state = {k: torch.from_numpy(np.array(v)) for k, v in state.items()}
        if self.ship_features and self._stamp is not None:
            current = self.policy.state_dict()
            if any(is_frozen(k) and not torch.equal(v, current[k].cpu()) for k, v in state.items() if k in current):
                self._stamp = None  # (published buffers are usually unchanged: no rehash for them)
        self.policy.load_trainable(state, allow_subset=True)
        self._version, self._staged = version, None
        ms = (time.perf_counter() - t0) * 1000.0
        self._counts["swaps"] += 1
        self._counts["swap_ms_total"] += ms
        self._counts["swap_ms_last"] = ms

    # --- inference ----------------------------------------------------------------------------------------------
    def infer(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """One forward pass on this batch (applies staged weights first). Returns numpy arrays + the version."""
        import torch

        with self._lock:
            self._apply_staged()
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = self.policy.act(self.policy.with_lang(batch), deterministic=self.deterministic,
                                      generator=self.generator, return_features=self.ship_features)
                extra = {}
                if self.ship_features:
                    if self._stamp is None:
                        self._stamp = frozen_stamp(self.policy)
                    extra = {**shipped(out["features"]), "frozen_stamp": self._stamp}
            self._counts["forward_s"] += time.perf_counter() - t0
            self._counts["batches"] += 1
            self._counts["rows"] += _rows(batch)
            # results leave as CPU numpy whatever the device: workers, segments and robots hold numpy
            return {"chunk": out["chunk"].cpu().numpy(), "mean": out["mean"].cpu().numpy(),
                    "value": out["value"].cpu().numpy(), "logp_pos": out["logp_steps"].cpu().numpy(),
                    "version": self._version, **extra}

    def submit(self, batch: Mapping[str, Any]) -> Future:
        """Queue a request for dynamic batching; the future resolves to the same dict as `infer`."""
        if self._thread is None:
            self.start()
        fut: Future = Future()
        self._requests.put((dict(batch), fut))
        return fut

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=f"{self.name}-batcher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                first = self._requests.get(timeout=0.1)
            except queue.Empty:
                continue
            pending = [first]
            rows = _rows(first[0])
            deadline = time.perf_counter() + self.timeout_s
            while rows < self.max_batch:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                try:
                    item = self._requests.get(timeout=remaining)
                except queue.Empty:
                    break
                pending.append(item)
                rows += _rows(item[0])
            try:
                result = self.infer(_concat([b for b, _ in pending]))
            except Exception as exc:  # a bad request fails its own future(s), never the server thread
                for _, fut in pending:
                    fut.set_exception(exc)
                continue
            start = 0
            for b, fut in pending:
                n = _rows(b)
                fut.set_result({k: (v[start:start + n] if isinstance(v, np.ndarray) else v)
                                for k, v in result.items()})
                start += n
