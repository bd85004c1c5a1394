"""PolicyHost: one checkpoint behind a batching `InferenceServer`, shared by the websocket server and local runs.

It owns what both transports need: the request spec (`ObsSpec`), the metadata frame, turning a batched result into
a reply, and hot reload. Reload is atomic and versioned because it goes through `InferenceServer.load_weights`:
weights are staged and applied by the batching thread between batches, so a reply is computed entirely by one
version, and that version is in the reply. A checkpoint only replaces the served one when its learner version is
newer and its architecture and normalization statistics are identical (a different normalization would silently
change what every action means: refuse and ask for a restart instead).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from acce.action_rates import checkpoint_action_rates
from acce.types import EnvSpec
from robot_bridge.protocol import DELAY_KEY, PROTOCOL, ObsSpec

logger = logging.getLogger(__name__)


def checkpoint_file(path: str | os.PathLike) -> Path:
    """The .pt file a checkpoint argument names (a run directory means its checkpoints/latest.pt)."""
    path = Path(path)
    if path.is_dir():
        return path / "checkpoints" / "latest.pt" if (path / "checkpoints").is_dir() else path / "latest.pt"
    return path


def _identity(data: Mapping[str, Any]) -> dict[str, Any]:
    """What must not change across a hot reload: architecture, dimensions, cameras, normalization (the env spec is
    compared on its own, so that a refusal can name the fields that differ)."""
    p = data["learner"]["policy"]
    return {k: p.get(k) for k in ("config", "state_dim", "action_dim", "cameras", "norm")}


def _env_spec(data: Mapping[str, Any]) -> EnvSpec:
    """The env spec a checkpoint's policy was trained for: saved with the policy, or derived (older checkpoints:
    widths, cameras and the action_repr's rate and scale, the run config's image size)."""
    from acce.checkpoint import checkpoint_image_size
    from acce.policy.vla import derived_env_spec
    p = data["learner"]["policy"]
    spec = EnvSpec.from_dict(p["env_spec"]) if p.get("env_spec") is not None else derived_env_spec(
        p, checkpoint_image_size(data))
    if spec is None:
        raise ValueError("the checkpoint has no env spec and too little to derive one (its normalization's "
                         "action_repr has no control_hz, or it has no config): a robot would not know the control "
                         "rate; save it with acce train (or VLAPolicy(..., env_spec=...))")
    return spec


class PolicyHost:
    """A served checkpoint: `spec` validates requests, `infer_async`/`infer` answer them, `reload_if_newer` swaps."""

    def __init__(self, checkpoint: str | os.PathLike, *, deterministic: bool = True, max_batch: int = 16,
                 batch_timeout_ms: float = 2.0, seed: int = 0, torch_threads: int = 0, inference_backend: str = "auto"):
        """torch_threads > 0 sets torch's (process-wide) intra-op thread count. Why: on the 2-core CI machine under
        load, the debug policy took 80-190 ms per call with torch's default 2 threads and 1-3 ms with 1.
        inference_backend: what runs vision + trunk ('auto', 'torch', 'onnxruntime'; ServeConfig.inference_backend)."""
        from acce.checkpoint import load_checkpoint, policy_from_checkpoint
        from acce.serving.inference import InferenceServer

        if torch_threads > 0:
            import torch
            torch.set_num_threads(torch_threads)
        self.path = checkpoint_file(checkpoint)
        data = load_checkpoint(self.path)
        self._stat = self._file_stat()
        policy = policy_from_checkpoint(data)
        self.inference = InferenceServer(policy, max_batch=max_batch, timeout_ms=batch_timeout_ms, seed=seed,
                                         deterministic=deterministic, name="serve", backend=inference_backend,
                                         reexport=True)  # a hot reload that changes the trunk exports it again
        self.max_batch = max_batch
        self.set_active_clients(1)
        self._trainable_keys = tuple(policy.trainable_state_dict())
        self._identity = _identity(data)
        self.env_spec = _env_spec(data)
        """the env the served policy was trained for; advertised to every client (metadata "env_spec")"""
        self._stage(data)
        cfg = data.get("config", {})
        env, rollout = cfg.get("env", {}), cfg.get("rollout", {})
        spec = self.env_spec
        self.spec = ObsSpec(cameras=spec.cameras, image_size=spec.image_size, state_dim=spec.state_dim,
                            action_dim=spec.action_dim, max_delay_steps=policy.config.max_delay_steps)
        self.chunk_len = policy.config.chunk_len
        self.action_repr = dict(policy.norm.action_repr)
        # the flat keys repeat the spec for clients that predate it (openpi's, older acce robots)
        self._static_meta = {
            "protocol": PROTOCOL, "policy": "acce.VLAPolicy", "chunk_len": self.chunk_len,
            "env_spec": spec.to_dict(), "action_dim": spec.action_dim, "state_dim": spec.state_dim,
            "cameras": list(spec.cameras), "image_size": spec.image_size, "max_delay_steps": self.spec.max_delay_steps,
            "execution_horizon": int(rollout.get("execution_horizon", max(1, self.chunk_len // 2))),
            "control_hz": spec.control_hz, "action_repr": self.action_repr,
            "tasks": list(env.get("tasks", [])), "task_params": dict(env.get("task_params", {})),
            "deterministic": deterministic, "request_keys": list(self.spec.keys)}
        rates, why_none = checkpoint_action_rates(data, self.path, spec)
        if rates is not None:  # the robot's default rate limits (robot_bridge.safety.with_data_rates)
            self._static_meta["action_rates"] = rates.to_dict()
        elif why_none:
            logger.warning("no data-derived rate limits to advertise: %s", why_none)
        self.stats = {"reloads": 0, "reload_refused": 0, "reload_errors": 0, "batch_retries": 0}
        self._warm_up()

    def _warm_up(self) -> None:
        """One inference before serving. Why: the first call loads the language encoder (MiniLM: ~4 s), which
        would otherwise land on the first robot request, trip its watchdog and pollute the latency record."""
        spec = self.spec
        obs: dict[str, Any] = {f"image/{c}": np.zeros((spec.image_size, spec.image_size, 3), np.uint8)
                               for c in spec.cameras}
        obs.update({"state": np.zeros(spec.state_dim, np.float32), "instruction": "warm up"})
        self.inference.infer(spec.to_batch(obs))

    # --- metadata and replies -------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """the weights version the next request runs on"""
        return self.inference.version

    def metadata(self) -> dict[str, Any]:
        """The frame a client receives on connect (the current version is read now)."""
        return {**self._static_meta, "policy_version": self.version}

    def reply(self, result: Mapping[str, Any], batch: Mapping[str, Any]) -> dict[str, Any]:
        """Reply for one request from its row of a batched result."""
        actions = np.clip(np.asarray(result["chunk"][0], np.float32), -1.0, 1.0)  # (H, A) in [-1, 1]
        delay = int(batch[DELAY_KEY][0]) if DELAY_KEY in batch else 0
        return {"actions": actions, "policy_version": int(result["version"]), "delay_steps": delay}

    # --- inference ------------------------------------------------------------------------------------------
    def set_active_clients(self, n: int) -> None:
        """Batch at most as many requests as there are connected clients. Why: a robot has one request in flight
        at a time, so with n clients the batching thread can stop waiting once n requests are in. Measured with
        the default policy on 2 cores: one client's round trip fell from 5.3 to 2.0 ms (no pointless wait for a
        second request), while 16 clients still share forward passes (with no batching at all they took 25 ms)."""
        self.inference.max_batch = max(1, min(int(n), self.max_batch))

    async def infer_async(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Batched with concurrent requests, off the event loop. If the shared batch fails, this request is
        retried alone, so a request that somehow passed validation but breaks the policy cannot fail its
        neighbours' replies (each of them retries alone too; only the culprit fails twice)."""
        try:
            return await asyncio.wrap_future(self.inference.submit(batch))
        except Exception:
            self.stats["batch_retries"] += 1
            return await asyncio.to_thread(self.inference.infer, batch)

    def infer(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """In-process request/reply with exactly the server's validation and reply (for `acce robot --checkpoint`)."""
        t0 = time.perf_counter()
        batch = self.spec.to_batch(obs)
        reply = self.reply(self.inference.infer(batch), batch)
        reply["server_timing"] = {"infer_ms": (time.perf_counter() - t0) * 1000.0}
        return reply

    # --- hot reload -----------------------------------------------------------------------------------------
    def _file_stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _stage(self, data: Mapping[str, Any]) -> int:
        version = int(data["learner"]["version"])
        if version > 0:  # the server starts at version 0; staging makes the checkpoint's version the served one
            state = data["learner"]["policy"]["state_dict"]
            self.inference.load_weights(version, {k: np.asarray(state[k].numpy()) for k in self._trainable_keys})
        return version

    def reload_if_newer(self) -> str | None:
        """Check the checkpoint file; stage its weights when it changed and holds a newer version.

        Blocking (reads the file): call it from a thread. Returns a one-line description of what happened, or None
        when the file did not change. Never raises: a half-copied or foreign file is counted and reported.
        """
        from acce.checkpoint import load_checkpoint

        stat = self._file_stat()
        if stat is None or stat == self._stat:
            return None
        self._stat = stat
        try:
            data = load_checkpoint(self.path)
            version, served = int(data["learner"]["version"]), self.version
            if _identity(data) != self._identity:
                self.stats["reload_refused"] += 1
                return (f"refused {self.path} (version {version}): architecture or normalization statistics differ "
                        "from the served checkpoint; restart acce serve to serve it")
            try:
                self.env_spec.check_compatible(_env_spec(data), "served", "new")
            except ValueError as err:
                self.stats["reload_refused"] += 1
                return f"refused {self.path} (version {version}): {err}; restart acce serve to serve it"
            if version <= served:
                return f"ignored {self.path}: version {version} is not newer than the served {served}"
            self._stage(data)
            self.stats["reloads"] += 1
            return f"staged version {version} from {self.path} (was {served}); it applies at the next batch"
        except Exception as err:  # a checkpoint mid-copy, a foreign file: keep serving the current weights
            self.stats["reload_errors"] += 1
            return f"could not reload {self.path}: {type(err).__name__}: {err}"

    def close(self) -> None:
        self.inference.stop()

