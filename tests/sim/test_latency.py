"""Latency models: d = ceil(latency_s * control_hz) with hand numbers, seeding, distributions, file formats, errors."""
import json

import numpy as np
import pytest

from acce.types import LatencyModel
from sim.latency import (
    LATENCY_KINDS,
    EmpiricalLatency,
    FixedLatency,
    UniformLatency,
    latency_to_steps,
    make_latency_model,
    read_latency_file,
)


@pytest.mark.parametrize(
    "latency_s, control_hz, steps",
    [
        (0.0, 10.0, 0),  # no latency: the new chunk runs from t_k
        (0.1, 10.0, 1),  # exactly one control period
        (0.25, 10.0, 3),  # 2.5 periods -> the 3rd step is still waiting
        (0.3, 10.0, 3),  # 0.3 * 10 == 3.0000000000000004 in float64; a bare ceil would say 4
        (0.7, 10.0, 7),  # 0.7 * 10 == 7.000000000000001 in float64
        (0.3000001, 10.0, 4),  # a hair over 3 periods really is 4 steps
        (0.05, 20.0, 1),
        (0.051, 20.0, 2),
        (1 / 3, 3.0, 1),
    ],
)
def test_latency_to_steps_hand_numbers(latency_s, control_hz, steps):
    assert latency_to_steps(latency_s, control_hz) == steps
    assert isinstance(latency_to_steps(latency_s, control_hz), int)


def test_latency_to_steps_vectorised():
    out = latency_to_steps(np.array([0.0, 0.1, 0.25, 0.3]), 10.0)
    assert out.dtype == np.int64
    assert out.tolist() == [0, 1, 3, 3]


@pytest.mark.parametrize("bad", [-0.01, float("nan"), float("inf")])
def test_latency_to_steps_rejects_bad_latency(bad):
    with pytest.raises(ValueError, match="latency_s"):
        latency_to_steps(bad, 10.0)


@pytest.mark.parametrize("hz", [0.0, -5.0, float("nan"), float("inf")])
def test_bad_control_hz(hz):
    with pytest.raises(ValueError, match="control_hz"):
        latency_to_steps(0.1, hz)
    with pytest.raises(ValueError, match="control_hz"):
        UniformLatency(0.0, 0.1, hz, seed=0)


def test_all_models_satisfy_protocol(tmp_path):
    path = tmp_path / "lat.txt"
    path.write_text("0.1\n0.2\n")
    for model in (FixedLatency(2, 10.0), UniformLatency(0.0, 0.2, 10.0, seed=0),
                  EmpiricalLatency.from_file(path, 10.0, seed=0)):
        assert isinstance(model, LatencyModel)
        assert isinstance(model.sample_steps(), int)
        assert isinstance(model.sample_latency_s(), float)


def test_fixed_latency():
    model = FixedLatency(3, control_hz=10.0)
    assert [model.sample_steps() for _ in range(5)] == [3] * 5
    assert model.sample_latency_s() == pytest.approx(0.3)
    assert model.max_steps == 3
    secs = FixedLatency.from_seconds(0.25, 10.0)
    assert secs.sample_steps() == 3 and secs.sample_latency_s() == 0.25
    assert FixedLatency(0).sample_steps() == 0
    with pytest.raises(ValueError, match="control_hz"):
        FixedLatency(2).sample_latency_s()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_fixed_latency_rejects_bad_steps(bad):
    with pytest.raises(ValueError, match="integer >= 0"):
        FixedLatency(bad, 10.0)


def test_fixed_from_seconds_rejects_negative():
    with pytest.raises(ValueError, match="latency_s"):
        FixedLatency.from_seconds(-0.1, 10.0)


def test_uniform_bounds_and_seeding():
    model = UniformLatency(0.12, 0.31, control_hz=10.0, seed=7)
    lat = np.array([model.sample_latency_s() for _ in range(5000)])
    assert lat.min() >= 0.12 and lat.max() <= 0.31
    # The range is covered, not collapsed: both ends are approached.
    assert lat.min() < 0.13 and lat.max() > 0.30
    steps = np.array([model.sample_steps() for _ in range(5000)])
    assert set(steps.tolist()) <= {2, 3, 4}  # ceil(1.2)=2 .. ceil(3.1)=4
    assert model.max_steps == 4
    a = UniformLatency(0.0, 0.5, 10.0, seed=3)
    b = UniformLatency(0.0, 0.5, 10.0, seed=3)
    assert [a.sample_steps() for _ in range(50)] == [b.sample_steps() for _ in range(50)]
    c = UniformLatency(0.0, 0.5, 10.0, seed=4)
    assert [a.sample_latency_s() for _ in range(20)] != [c.sample_latency_s() for _ in range(20)]


def test_uniform_degenerate_interval():
    model = UniformLatency(0.2, 0.2, 10.0, seed=0)
    assert {model.sample_steps() for _ in range(20)} == {2}


@pytest.mark.parametrize("low, high, match", [(0.3, 0.1, "low_s <= high_s"), (-0.1, 0.2, "low_s"),
                                              (0.0, float("nan"), "high_s")])
def test_uniform_bad_inputs(low, high, match):
    with pytest.raises(ValueError, match=match):
        UniformLatency(low, high, 10.0, seed=0)


@pytest.fixture
def lognormal_latencies():
    # ~80 ms median with a right tail: the shape a real inference server has.
    return np.random.default_rng(123).lognormal(mean=np.log(0.08), sigma=0.5, size=20_000)


@pytest.mark.parametrize("fmt", ["txt", "json"])
def test_empirical_reproduces_distribution(tmp_path, lognormal_latencies, fmt):
    src = lognormal_latencies
    if fmt == "json":
        path = tmp_path / "latency.json"
        path.write_text(json.dumps({"latency_s": src.tolist(), "control_hz": 10.0, "source": "robot_bridge"}))
    else:
        path = tmp_path / "latency.txt"
        path.write_text("# measured on robot\n" + "\n".join(repr(float(v)) for v in src) + "\n\n")
    np.testing.assert_array_equal(read_latency_file(path), src)  # repr round-trips float64 exactly

    hz, n = 10.0, 20_000
    model = EmpiricalLatency.from_file(path, control_hz=hz, seed=0)
    lat = np.array([model.sample_latency_s() for _ in range(n)])
    q_src = np.quantile(src, [0.1, 0.5, 0.9])
    q_lat = np.quantile(lat, [0.1, 0.5, 0.9])
    # Bootstrap error of a quantile at n=20k is ~1-2 % of its value; 5 % leaves ample margin.
    np.testing.assert_allclose(q_lat, q_src, rtol=0.05)
    assert set(np.unique(lat)) <= set(src)  # bootstrap only ever returns measured values

    # Steps: the sampled step histogram matches the histogram of ceil(src * hz).
    steps = np.array([model.sample_steps() for _ in range(n)])
    src_steps = np.ceil(src * hz).astype(int)
    assert set(steps.tolist()) <= set(src_steps.tolist())
    top = max(steps.max(), src_steps.max()) + 1
    p_sampled = np.bincount(steps, minlength=top) / n
    p_source = np.bincount(src_steps, minlength=top) / src.size
    np.testing.assert_allclose(p_sampled, p_source, atol=0.015)
    assert model.max_steps == src_steps.max()


def test_empirical_steps_match_latency_draws():
    # Same seed -> the same index draws, so steps must be exactly ceil of the drawn seconds.
    values = [0.0, 0.1, 0.25, 0.3, 0.42]
    a = EmpiricalLatency(values, control_hz=10.0, seed=5)
    b = EmpiricalLatency(values, control_hz=10.0, seed=5)
    secs = [a.sample_latency_s() for _ in range(200)]
    steps = [b.sample_steps() for _ in range(200)]
    assert steps == [latency_to_steps(s, 10.0) for s in secs]
    assert set(steps) == {0, 1, 3, 5}


def test_empirical_seeded_determinism():
    values = np.linspace(0.0, 1.0, 101)
    a, b = EmpiricalLatency(values, 10.0, seed=11), EmpiricalLatency(values, 10.0, seed=11)
    assert [a.sample_steps() for _ in range(100)] == [b.sample_steps() for _ in range(100)]


@pytest.mark.parametrize(
    "content, suffix, match",
    [
        ("", ".txt", "at least one"),
        ("# only a comment\n\n", ".txt", "at least one"),
        ("0.1\nnan\n", ".txt", "finite"),
        ("0.1\ninf\n", ".txt", "finite"),
        ("0.1\n-0.2\n", ".txt", ">= 0"),
        ("0.1\nfast\n", ".txt", "line 2"),
        ('{"latency_s": []}', ".json", "at least one"),
        ('{"latency_s": [0.1, NaN]}', ".json", "finite"),
        ('{"latency_ms": [80]}', ".json", "'latency_s'"),
        ('{"latency_s": 0.1}', ".json", "list"),
        ('{"latency_s": [0.1, "x"]}', ".json", "only numbers"),
        ('{"latency_s": [0.1,', ".json", "not valid JSON"),
        ("[0.1, 0.2]", ".json", "JSON object"),
    ],
)
def test_empirical_bad_files(tmp_path, content, suffix, match):
    path = tmp_path / f"lat{suffix}"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        EmpiricalLatency.from_file(path, control_hz=10.0, seed=0)


def test_empirical_missing_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        EmpiricalLatency.from_file(tmp_path / "nope.json", control_hz=10.0, seed=0)


def test_empirical_json_without_suffix(tmp_path):
    path = tmp_path / "latencies.log"
    path.write_text('{"latency_s": [0.2, 0.2]}')
    assert EmpiricalLatency.from_file(path, 10.0, seed=0).sample_steps() == 2


def test_factory(tmp_path):
    path = tmp_path / "lat.json"
    path.write_text(json.dumps({"latency_s": [0.15]}))
    assert make_latency_model("fixed", control_hz=10.0, seed=0, fixed_steps=2).sample_steps() == 2
    uni = make_latency_model("uniform", control_hz=10.0, seed=0, low_s=0.1, high_s=0.2)
    assert isinstance(uni, UniformLatency) and uni.sample_steps() in (1, 2)
    emp = make_latency_model("empirical", control_hz=10.0, seed=0, path=path)
    assert isinstance(emp, EmpiricalLatency) and emp.sample_steps() == 2
    assert isinstance(make_latency_model("fixed", control_hz=10.0, seed=None), FixedLatency)


def test_factory_errors():
    with pytest.raises(ValueError) as err:
        make_latency_model("gaussian", control_hz=10.0, seed=0)
    for kind in LATENCY_KINDS:
        assert kind in str(err.value)
    with pytest.raises(ValueError, match="path="):
        make_latency_model("empirical", control_hz=10.0, seed=0)
    with pytest.raises(ValueError, match="low_s <= high_s"):
        make_latency_model("uniform", control_hz=10.0, seed=0, low_s=0.5, high_s=0.1)
    with pytest.raises(ValueError, match="integer >= 0"):
        make_latency_model("fixed", control_hz=10.0, seed=0, fixed_steps=-1)


@pytest.mark.parametrize("make", [lambda: UniformLatency(0.0, 0.9, 10.0, seed=3),
                                  lambda: EmpiricalLatency([0.05, 0.15, 0.25, 0.35, 0.45], 10.0, seed=3)])
def test_spawn_gives_each_parallel_user_its_own_reproducible_draws(make):
    parent, twin = make(), make()
    a, a_again, b = parent.spawn(1), twin.spawn(1), parent.spawn(2)
    draws = lambda m: [m.sample_steps() for _ in range(40)]  # noqa: E731
    first = draws(a)
    assert first == draws(a_again)  # same seed and key: the same stream
    assert first != draws(b)  # another key: another stream
    assert draws(parent) == draws(twin)  # spawning never moved the parent's own generator
    assert type(a) is type(parent) and a.max_steps == parent.max_steps


def test_a_fixed_latency_is_shared_by_its_spawns():
    fixed = FixedLatency(3, 10.0)
    assert fixed.spawn(5) is fixed
