"""runtime: local — the same roles in one process, interleaved deterministically (debugging and tests).

async: workers take turns producing segments into the bounded queue; the learner updates whenever a batch is
ready and publishes; the server swaps at its next batch. The StalenessGate paces producers exactly as on Ray.
sync: the barrier baseline — every env produces one segment with the round's weights (more rounds with the same
weights until learner.batch_segments are there), the learner consumes them, publishes, and the next round opens.
imagination (async only): after each sim worker's turn, LocalImagination feeds the recorded episodes to the world
model, trains and publishes it, and lets one imagination worker collect; batches come from the SourceMixer.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from acce.runtime.imagination import LocalImagination
from acce.serving.inference import InferenceServer
from acce.runtime.queue import RolloutQueue, StalenessGate, SyncGate
from acce.runtime.weights import WeightStore
from acce.runtime.worker import RolloutWorker


class LocalRuntime:
    def __init__(self, cfg, learner, make_env: Callable[[int], Any], *, make_latency=None, on_episode=None,
                 make_imagined_env=None, make_wm_trainer=None):
        from acce.device import place
        from acce.policy.vla import VLAPolicy

        self.cfg, self.learner = cfg, learner
        r, lc = cfg.rollout, cfg.learner
        # one process: the server runs where the learner's policy was placed (runtime.device, runtime.amp)
        server_policy = place(VLAPolicy.from_state(learner.policy.policy_state()), learner.policy.device,
                              learner.policy.amp)
        self.server = InferenceServer(server_policy, max_batch=cfg.runtime.max_batch,
                                      timeout_ms=cfg.runtime.timeout_ms, seed=cfg.run.seed + 7,
                                      ship_features=lc.train_scope == "residual")
        self.weights = WeightStore()
        self.sync = cfg.runtime.mode == "sync"
        self.imagination = LocalImagination(cfg, self.server, make_imagined_env, make_wm_trainer, make_latency) \
            if cfg.imagination.enabled else None
        if self.imagination is not None:  # sim workers record real episodes for the world-model trainer
            make_env = self.imagination.wrap_env_factory(make_env)
        envs = [make_env(w) for w in range(r.num_workers)]
        total_envs = sum(e.num_envs for e in envs)
        self.gate = SyncGate(total_envs) if self.sync else StalenessGate(lc.batch_segments, lc.steps_per_update,
                                                                         lc.max_staleness, learner.version)
        self._updates0 = learner.updates  # a resumed learner has updates before this run's gate existed
        self.workers = [RolloutWorker(env, self.server, worker_id=w, segment_len=r.segment_len,
                                      chunk_len=cfg.policy.chunk_len, exec_horizon=r.execution_horizon,
                                      max_delay=cfg.policy.max_delay_steps, gamma=lc.gamma,
                                      delay_aware=lc.delay_correction,
                                      latency=make_latency(w) if make_latency else None, gate=self.gate)
                        for w, env in enumerate(envs)]
        self.queue = RolloutQueue(cfg.runtime.queue_capacity)
        if self.imagination is not None:
            self.imagination.attach_sim_gate(self.gate)
        self.on_episode = on_episode
        self._turn = 0
        self.idle = {"learner_wait_s": 0.0, "actor_wait_s": 0.0}

    def start(self) -> None:
        self.publish()

    def publish(self) -> None:
        state = self.learner.trainable_state()
        self.weights.publish(self.learner.version, state)
        self.server.load_weights(self.learner.version, state)
        if self.sync:
            self.gate.open_round(self.learner.version)

    def _episodes(self, worker: RolloutWorker) -> list[dict]:
        eps = worker.drain_episodes()
        for ep in eps:
            ep["worker_id"] = worker.worker_id
            if self.on_episode is not None:
                self.on_episode(ep)
        return eps

    def poll(self) -> dict[str, Any]:
        updates, episodes = [], []
        if self.sync:
            segments = []
            while True:  # rounds with the same weights until the batch (learner.batch_segments) is full
                for w in self.workers:
                    # apply the round's weights before sampling: the server swaps at its next batch
                    segments += w.collect(min_segments=w.env.num_envs)
                    episodes += self._episodes(w)
                if len(segments) >= self.cfg.learner.batch_segments:
                    break
                self.gate.open_round(self.learner.version)
            updates.append(self.learner.update(segments))
            self.publish()
        else:
            w = self.workers[self._turn % len(self.workers)]
            self._turn += 1
            for seg in w.collect(min_segments=1, max_steps=64):
                # one process: a full queue cannot wait for the learner, so the learner runs first
                while not self.queue.try_put(seg):
                    updates.append(self._update(self._batch()))
            episodes += self._episodes(w)
            if self.imagination is not None:
                episodes += self.imagination.turn()
            while (batch := self._batch(wait=False)) is not None:
                updates.append(self._update(batch))
        return {"updates": updates, "episodes": episodes}

    def _batch(self, wait: bool = True) -> list | None:
        """The next learner batch: b sim segments, or a mixed one with imagination; None when not ready (wait=False)."""
        b = self.cfg.learner.batch_segments
        if self.imagination is not None:
            return self.imagination.take_batch(self.queue)
        return self.queue.get_batch(b) if wait or len(self.queue) >= b else None

    def _update(self, batch: list) -> dict[str, Any]:
        mix = self.imagination.mixer.metrics(batch, self.learner.version) if self.imagination is not None else {}
        update = {**self.learner.update(batch), **mix}
        if isinstance(self.gate, StalenessGate):  # what the update really reached (learner.kl_stop may end it early)
            self.gate.consumed(self.learner.updates - self._updates0, self.learner.version)
        self.publish()
        return update

    def stop(self) -> dict[str, Any]:
        """Nothing runs between polls in one process: nothing to stop or drain."""
        return {"updates": [], "episodes": []}

    def learner_state(self) -> dict[str, Any]:
        return self.learner.state_dict()

    def policy_state(self) -> dict[str, Any]:
        return self.learner.policy.policy_state()

    def stats(self) -> dict[str, float]:
        env_steps = sum(w.stats["env_steps"] for w in self.workers)
        return {"env_steps": env_steps, "learner_version": self.learner.version,
                "server_version": self.server.version, "queue_size": len(self.queue),
                "queue_capacity": self.cfg.runtime.queue_capacity, "swap_ms": self.server.stats["swap_ms_last"],
                "server": dict(self.server.stats),
                "worker_stats": [dict(w.stats) for w in self.workers],
                **(self.imagination.stats() if self.imagination is not None else {})}

    def shutdown(self) -> None:
        for w in self.workers:
            w.close()
        if self.imagination is not None:
            self.imagination.close()
        self.server.stop()
        time.sleep(0)
