"""Evaluator (acce/runtime/evaluator.py) on a counting fake env: exactly the first N seeds of the split are counted,
never the first N episodes to finish, and a cell names the seeds that failed."""
from types import SimpleNamespace

import numpy as np
import pytest

from acce.runtime.evaluator import Evaluator
from acce.wiring import SEED_SPLIT_STARTS

H, A = 4, 2


def outcome(seed: int) -> tuple[bool, int]:
    """(success, length) of an episode, fixed by its seed: every third seed fails, lengths 1..5 so later seeds
    often finish before earlier ones"""
    return seed % 3 != 0, 1 + (seed * 7) % 5


class FakeVecEnv:
    action_dim = A

    def __init__(self, n: int, episode_seeds):
        self.n, self.episode_seeds = n, episode_seeds
        self.seeds = np.zeros(n, np.int64)
        self.t = np.zeros(n, np.int64)
        self.started: list[int] = []

    def _start(self, i: int, seed: int) -> None:
        self.seeds[i], self.t[i] = seed, 0
        self.started.append(seed)

    def reset(self, seeds):
        for i, s in enumerate(seeds):
            self._start(i, int(s))

    def observe(self, idx):
        return {"state": np.zeros((len(idx), 3), np.float32), "instruction": ["touch it"] * len(idx),
                "task_id": np.zeros(len(idx), np.int64)}

    def step(self, actions, render=False, active=None):
        n = self.n
        done, success, ep_success = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
        length, seeds = np.zeros(n, np.int64), self.seeds.copy()
        for i in range(n) if active is None else np.flatnonzero(active):
            self.t[i] += 1
            ok, steps = outcome(int(self.seeds[i]))
            if self.t[i] >= steps:
                done[i], success[i], ep_success[i], length[i] = True, ok, ok, steps
        for i in np.flatnonzero(done):
            self._start(i, int(next(self.episode_seeds)))
        return SimpleNamespace(reward=success.astype(np.float32), success=success, done=done, final_obs={},
                               episode_success=ep_success, info={"seed": seeds, "episode_length": length,
                                                                 "episode_return": success.astype(np.float32)})

    def close(self):
        pass


class FakeServer:
    def __init__(self):
        self.calls = 0

    def infer(self, req):
        self.calls += 1
        n = len(req["instruction"])
        return {"chunk": np.zeros((n, H, A), np.float32), "logp_pos": np.zeros((n, H), np.float32),
                "value": np.zeros(n, np.float32), "version": 3}


@pytest.mark.parametrize("split", ["val", "test"])
def test_a_cell_counts_exactly_the_first_seeds_and_names_the_failures(split):
    envs = []

    def make_env(tasks, n, seeds, instruction_split, episode_seeds):
        envs.append(FakeVecEnv(n, episode_seeds))
        return envs[-1]

    server = FakeServer()
    ev = Evaluator(make_env, server, tasks=["reach"], episodes=20, num_envs=4, chunk_len=H, exec_horizon=2)
    cell = ev.run(split)["per_task"][f"reach/{split}"]
    first = SEED_SPLIT_STARTS[split]
    expected = [first + k for k in range(20)]
    wins = [s for s in expected if outcome(s)[0]]
    assert cell["n"] == 20 and cell["successes"] == len(wins) and cell["success_rate"] == pytest.approx(len(wins) / 20)
    assert cell["failed_seeds"] == [s for s in expected if not outcome(s)[0]]
    assert cell["seeds"] == [expected[0], expected[-1]]
    assert cell["mean_length"] == pytest.approx(np.mean([outcome(s)[1] for s in expected]))
    assert set(expected) <= set(envs[0].started) and server.calls > 0


class BatchRecordingServer(FakeServer):
    def __init__(self):
        super().__init__()
        self.sizes = []

    def infer(self, req):
        self.sizes.append(len(req["instruction"]))
        return super().infer(req)


def test_aligned_decisions_give_the_same_cell_in_full_batches():
    """rollout.align_decisions: episodes of 1-5 steps at horizon 2 fall due at different control steps; aligned,
    every decision is a batch of all 4 envs and the cell (which seeds, which succeed, their lengths) is unchanged."""
    def cell(align):
        def make_env(tasks, n, seeds, instruction_split, episode_seeds):
            return FakeVecEnv(n, episode_seeds)

        server = BatchRecordingServer()
        ev = Evaluator(make_env, server, tasks=["reach"], episodes=20, num_envs=4, chunk_len=H, exec_horizon=2,
                       align_decisions=align)
        return ev.run("val")["per_task"]["reach/val"], server.sizes

    plain, plain_sizes = cell(False)
    aligned, aligned_sizes = cell(True)
    assert min(plain_sizes) < 4 and set(aligned_sizes) == {4}
    assert len(aligned_sizes) < len(plain_sizes)
    assert aligned == plain


class ThreadRecordingServer(FakeServer):
    """FakeServer that notes the torch thread count its forward passes would run with."""

    def __init__(self):
        super().__init__()
        self.torch_threads: set[int] = set()

    def infer(self, req):
        import torch
        self.torch_threads.add(torch.get_num_threads())
        return super().infer(req)


class SpawningLatency:
    """A latency model that hands every parallel user its own child and notes which threads drew from which model."""

    def __init__(self, key=0):
        self.key, self.children, self.threads = key, [], set()

    def sample_steps(self):
        import threading
        self.threads.add(threading.current_thread().name)
        return 0

    def spawn(self, key):
        self.children.append(SpawningLatency(key))
        return self.children[-1]


@pytest.mark.parametrize("groups", [2, 3])
def test_env_groups_evaluate_the_same_seeds_on_their_own_threads(groups):
    import threading

    import torch

    def run(n_groups, latency=None):
        envs, threads = [], []

        def make_env(tasks, n, seeds, instruction_split, episode_seeds):
            threads.append(threading.current_thread().name)
            envs.append(FakeVecEnv(n, episode_seeds))
            return envs[-1]

        server = ThreadRecordingServer()
        ev = Evaluator(make_env, server, tasks=["reach"], episodes=20, num_envs=4, chunk_len=H, exec_horizon=2,
                       groups=n_groups, latency=latency)
        return ev.run("test")["per_task"]["reach/test"], envs, threads, server

    before = torch.get_num_threads()
    one, _, _, _ = run(1)
    latency = SpawningLatency()
    cell, envs, threads, server = run(groups, latency)
    assert {k: cell[k] for k in ("n", "successes", "failed_seeds", "mean_length", "seeds")} == \
        {k: one[k] for k in ("n", "successes", "failed_seeds", "mean_length", "seeds")}
    assert len(envs) == groups and len(set(threads)) == groups and threading.main_thread().name not in threads
    first = SEED_SPLIT_STARTS["test"]
    for g, env in enumerate(envs):  # each group's own seeds, then spares no other group draws
        mine = {first + k for k in range(20)}.intersection(env.started)
        assert mine == {first + k for k in range(g, 20, groups)}
    spares = [set(env.started) - {first + k for k in range(20)} for env in envs]
    assert all(not (a & b) for i, a in enumerate(spares) for b in spares[i + 1:])
    # group 0 draws from the evaluator's model, every other group from its own spawned child, one thread each
    assert [c.key for c in latency.children] == list(range(1, groups))
    assert all(len(m.threads) == 1 for m in [latency, *latency.children])
    # forward passes ran on one torch thread while the groups shared the cores; the setting is restored afterwards
    assert server.torch_threads == {1} and torch.get_num_threads() == before


def test_groups_must_be_positive():
    with pytest.raises(ValueError, match="groups must be >= 1"):
        Evaluator(lambda *a, **k: None, FakeServer(), tasks=["reach"], groups=0)


@pytest.mark.parametrize("seed_split, instructions, expected", [
    ("val", ("heldout",), ["val"]), ("test", ("heldout",), ["heldout"]),
    ("val", ("heldout", "train"), ["val", "train"]), ("test", ("train",), ["train"])])
def test_held_out_instructions_on_validation_seeds_are_the_validation_paraphrases(seed_split, instructions, expected):
    """Validation never sees the test paraphrases: the cell keeps its name ('heldout'), the env gets 'val'."""
    asked = []

    def make_env(tasks, n, seeds, instruction_split, episode_seeds):
        asked.append((seeds, instruction_split))
        return FakeVecEnv(n, episode_seeds)

    ev = Evaluator(make_env, FakeServer(), tasks=["reach"], episodes=4, num_envs=4, chunk_len=H, exec_horizon=2)
    cells = ev.run(seed_split, instructions=instructions)["per_task"]
    assert asked == [(seed_split, e) for e in expected]
    assert [c["split"] for c in cells.values()] == list(instructions)


class SimServer(FakeServer):
    """Zero chunks of the sim's 4-d actions (the episodes run to their time limit)."""

    def infer(self, req):
        out = super().infer(req)
        out["chunk"] = np.zeros((len(req["instruction"]), H, 4), np.float32)
        return out


def test_validation_and_test_evaluations_read_different_paraphrases_in_the_sim():
    from acce.wiring import make_sim_env
    from sim.tasks import TASKS

    seen = {}
    for seed_split in ("val", "test"):
        def make_env(tasks, n, seeds, instruction_split, episode_seeds, seed_split=seed_split):
            env = make_sim_env(tasks, n, seeds=seeds, instruction_split=instruction_split, episode_seeds=episode_seeds)
            observe = env.observe

            def recording_observe(*args, **kwargs):
                obs = observe(*args, **kwargs)
                seen.setdefault(seed_split, set()).update(obs["instruction"])
                return obs
            env.observe = recording_observe
            return env
        Evaluator(make_env, SimServer(), tasks=["reach"], episodes=4, num_envs=4, chunk_len=H,
                  exec_horizon=2).run(seed_split)
    val_verbs = {t.split()[0] for t in TASKS["reach"].val_templates}
    test_verbs = {t.split()[0] for t in TASKS["reach"].heldout_templates}
    assert {i.split()[0] for i in seen["val"]} <= val_verbs and {i.split()[0] for i in seen["test"]} <= test_verbs
    assert seen["val"] and seen["test"] and seen["val"].isdisjoint(seen["test"])
