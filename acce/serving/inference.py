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
import warnings
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
    onnx_attaches: int = 0
    """times ONNX Runtime took over the policy's vision + trunk (backend auto/onnxruntime): once per frozen weights"""


class InferenceServer:
    """Owns one policy network. `infer` is the direct in-thread path; `submit` goes through dynamic batching.
    The policy runs where its owner placed it (acce.device.place: device and mixed precision)."""

    def __init__(self, policy, *, max_batch: int = 64, timeout_ms: float = 2.0, seed: int = 0,
                 deterministic: bool = False, name: str = "server", ship_features: bool = False,
                 backend: str = "torch", reexport: bool = False):
        """ship_features: every result also carries the rows' frozen features ('frozen/KEY') and the policy's
        'frozen_stamp' (acce.policy.frozen; learner.train_scope=residual, whose learner then skips vision + trunk).
        backend: what runs vision + trunk (runtime.inference_backend; acce.policy.onnx_frozen): 'torch'; 'onnxruntime'
        (exported at the first batch; after a swap that changes a frozen tensor torch serves while a background
        thread exports the new weights); 'auto' = ONNX Runtime where it applies and exports (else torch, with one
        warning), until the first swap that changes a frozen tensor (full-network training would export every
        version), then torch, unless `reexport` (a served checkpoint's reload: as 'onnxruntime' does)."""
        import torch

        from acce.device import INFERENCE_BACKENDS
        from acce.policy.onnx_frozen import applies_to

        if backend not in INFERENCE_BACKENDS:
            raise ValueError(f"inference backend must be one of {list(INFERENCE_BACKENDS)}, got {backend!r}")
        self.policy = policy.eval()
        why_not = None if backend == "torch" else applies_to(self.policy)
        if backend == "onnxruntime" and why_not:
            raise ValueError(f"runtime.inference_backend=onnxruntime cannot serve this policy: {why_not}; use auto "
                             "or torch")
        self.backend = backend
        self.reexport = backend == "onnxruntime" or bool(reexport)
        self._onnx = backend != "torch" and why_not is None
        """whether the next batch without a frozen backend attaches one"""
        self.policy.frozen_backend = None
        self._example: dict[str, Any] | None = None
        """validated inputs of the batch the last export used: the example a re-export traces with"""
        self._reexport: Future | None = None
        """a background export of the current frozen weights (backend onnxruntime, after a swap that changed them)"""
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
        changed = False
        if (self.ship_features and self._stamp is not None) or self._example is not None:
            current = self.policy.state_dict()
            changed = any(is_frozen(k) and not torch.equal(v, current[k].cpu()) for k, v in state.items()
                          if k in current)
            if changed:
                self._stamp = None  # (published buffers are usually unchanged: no rehash for them)
                self.policy.frozen_backend = None
                self._onnx = self._onnx and self.reexport  # in training, an export per version costs more
                self._example = self._example if self._onnx else None  # (and no more checks for it)
        self.policy.load_trainable(state, allow_subset=True)
        if changed and self._onnx and self._example is not None and self._reexport is None:
            self._reexport = self._export_in_background()  # one at a time: a stale result is redone when taken
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
            batch = self.policy.with_lang(batch)
            if self._onnx and self.policy.frozen_backend is None:
                self._attach_onnx(batch)  # (an export traces, which inference mode forbids)
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = self.policy.act(batch, deterministic=self.deterministic,
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

    @property
    def backend_in_use(self) -> str:
        """'onnxruntime' while ONNX Runtime runs vision + trunk, else 'torch'."""
        return "torch" if self.policy.frozen_backend is None else "onnxruntime"

    def _attach_onnx(self, batch: Mapping[str, Any]) -> None:
        """The first batch exports in place; after a swap, the background export's result is taken once ready."""
        from acce.policy.onnx_frozen import OnnxFrozen

        try:
            if self._reexport is not None:
                if not self._reexport.done():
                    return  # torch serves meanwhile
                made, self._reexport = self._reexport.result(), None
                if made.stamp != frozen_stamp(self.policy):  # the weights changed again while it exported
                    self._reexport = self._export_in_background()
                    return
            else:
                x = self.policy._inputs(batch)  # a bad batch fails here with its own message, not as an export's
                made, self._example = OnnxFrozen.for_policy(self.policy, x), x
            self.policy.frozen_backend = made
            if self.ship_features and self._stamp is None:
                self._stamp = made.stamp  # hashed once: the export's stamp is frozen_stamp of these weights
        except Exception as e:  # noqa: BLE001 - auto falls back to torch, saying why once
            if self.backend == "onnxruntime":
                raise
            self._onnx = False
            warnings.warn(f"{self.name}: ONNX Runtime could not take over vision + trunk ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); serving with torch")
            return
        self._counts["onnx_attaches"] += 1

    def _export_in_background(self) -> Future:
        """Export a copy of the policy as it is now (the live one keeps serving with torch)."""
        from acce.policy.onnx_frozen import OnnxFrozen

        copy, example, fut = type(self.policy).from_state(self.policy.policy_state()).eval(), self._example, Future()

        def run() -> None:
            try:
                fut.set_result(OnnxFrozen.for_policy(copy, example))
            except Exception as e:  # noqa: BLE001 - delivered to the batch that takes it
                fut.set_exception(e)
        threading.Thread(target=run, name=f"{self.name}-onnx-export", daemon=True).start()
        return fut

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
