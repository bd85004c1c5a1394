"""bc.task_weights / collect.task_weights: each task's share of the recorded demos and the DAgger episodes."""
from __future__ import annotations

import collections

import pytest

from acce.collect import split_episodes
from acce.config import load
from acce.configlib import ConfigError


def test_episodes_split_by_weight_with_largest_remainders():
    assert split_episodes(200, ["reach", "push"]) == {"reach": 100, "push": 100}
    assert split_episodes(200, ["reach", "push"], {"push": 3}) == {"reach": 50, "push": 150}
    # evenly: the first tasks take the remainder, as the even split always did (7 = 3 + 2 + 2)
    assert split_episodes(7, ["a", "b", "c"]) == {"a": 3, "b": 2, "c": 2}
    # 10 * (1, 2, 2) / 5 = 2, 4, 4 exactly; 11 * (1, 1, 3) / 5 = 2.2, 2.2, 6.6: c's .6 takes the one left over
    assert split_episodes(10, ["a", "b", "c"], {"b": 2, "c": 2}) == {"a": 2, "b": 4, "c": 4}
    assert split_episodes(11, ["a", "b", "c"], {"c": 3}) == {"a": 2, "b": 2, "c": 7}
    assert split_episodes(10, ["a", "b"], {"a": 0}) == {"a": 0, "b": 10}
    with pytest.raises(ValueError, match="weight 0"):
        split_episodes(10, ["a", "b"], {"a": 0, "b": 0})


@pytest.mark.parametrize("override, message", [
    ("bc.task_weights={pussh: 3}", "unknown task"),
    ("bc.task_weights={push: -1}", ">= 0"),
    ("bc.task_weights={push: 0, reach: 0}", "weight 0"),
    ("collect.task_weights={bogus: 3}", "unknown task"),
])
def test_bad_task_weights_are_one_config_error(override, message):
    with pytest.raises(ConfigError, match=message):
        load("configs/default.yaml", [override])


def test_a_presets_weights_survive_an_env_tasks_override():
    """the main job's {push: 3} must not break `acce train --config configs/default.yaml "env.tasks=[reach]"`"""
    assert load("configs/default.yaml", ["env.tasks=[reach]"]).bc.task_weights == {"push": 3.0}
    assert load("configs/default.yaml", ["env.tasks=[metaworld/reach-v3]"]).env.tasks == ("metaworld/reach-v3",)
    with pytest.raises(ConfigError, match="weight 0"):
        load("configs/default.yaml", ["env.tasks=[reach]", "bc.task_weights={reach: 0}"])


def test_collect_records_the_weighted_split(tmp_path, capsys):
    from acce.cli import main
    from acce.store.episodes import EpisodeStore

    out = tmp_path / "eps.zarr"
    assert main(["collect", "--config", "configs/debug.yaml", "--task", "reach", "--task", "push", "--episodes", "8",
                 "--out", str(out), "collect.task_weights={push: 3}"]) == 0
    counts = collections.Counter(ep.task for ep in EpisodeStore.open(out).iter_episodes())
    assert counts == {"reach": 2, "push": 6}


def test_the_warm_start_hands_the_weights_to_cloning_and_dagger(tmp_path, monkeypatch):
    import acce.collect
    import acce.dagger
    from acce.store.episodes import EpisodeStore
    from acce.warmstart import bc_warmstart

    calls = {"collect": [], "dagger": []}
    real_collect = acce.collect.collect

    def spying_collect(ccfg, *args, **kw):
        calls["collect"].append(dict(ccfg.task_weights))
        return real_collect(ccfg, *args, **kw)

    def fake_dagger(policy, make_env, tasks, episodes, **kw):
        calls["dagger"].append(kw["task_weights"])
        return [], [], {}

    monkeypatch.setattr(acce.collect, "collect", spying_collect)
    monkeypatch.setattr(acce.dagger, "dagger_rollouts", fake_dagger)
    cfg = load("configs/debug.yaml", ["bc.episodes=4", "bc.steps=2", "bc.dagger_rounds=1", "env.tasks=[reach, push]",
                                      "bc.task_weights={push: 3}"])

    class Metrics:
        def scalars(self, values, step):
            pass

        def scalar(self, *args, **kwargs):
            pass
    bc_warmstart(cfg, tmp_path, metrics=Metrics(), progress=False)
    assert calls == {"collect": [{"push": 3.0}], "dagger": [{"push": 3.0}]}
    demos = collections.Counter(ep.task for ep in EpisodeStore.open(tmp_path / "demos.zarr").iter_episodes())
    assert demos == {"reach": 1, "push": 3}
