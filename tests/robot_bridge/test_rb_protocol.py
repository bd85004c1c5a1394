"""The openpi websocket protocol: the unmodified openpi-client (own venv, numpy < 2) against our server; codec,
auth, /healthz, bind rules, hot reload."""
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from robot_bridge.client import PolicyError, RemotePolicy
from robot_bridge.protocol import ObsSpec, RequestError, packb, unpackb
from robot_bridge.server import PolicyServer, ServeConfig

ROOT = Path(__file__).resolve().parents[2]
OPENPI_PY = ROOT / ".venv-openpi" / "bin" / "python"

CLIENT = r"""
import json, sys
import numpy as np
from openpi_client import websocket_client_policy as wcp
url, key, size = sys.argv[1], sys.argv[2] or None, int(sys.argv[3])
out = {"numpy": np.__version__}
policy = wcp.WebsocketClientPolicy(host=url, api_key=key)
meta = policy.get_server_metadata()
out["meta"] = {k: meta[k] for k in ("protocol", "chunk_len", "action_dim", "image_size", "policy_version")}
obs = {"image/front": np.zeros((size, size, 3), np.uint8), "state": np.zeros(7, np.float32),
       "prompt": "touch the red cube"}
reply = policy.infer(obs)
out["actions"] = [list(reply["actions"].shape), str(reply["actions"].dtype), float(np.abs(reply["actions"]).max())]
out["version"] = int(reply["policy_version"])
out["timing"] = sorted(reply["server_timing"])
try:
    policy.infer({"state": np.zeros(3, np.float64)})
    out["error"] = None
except RuntimeError as err:
    out["error"] = str(err)
out["after_error"] = list(policy.infer(obs)["actions"].shape)
print(json.dumps(out))
"""


def _openpi_python() -> Path:
    """The openpi-client venv, created by scripts/setup_openpi.sh when missing (idempotent; never skipped)."""
    if not OPENPI_PY.exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "setup_openpi.sh")], check=True, timeout=600)
    return OPENPI_PY


def _run_client(url: str, key: str = "", size: int = 32) -> subprocess.CompletedProcess:
    return subprocess.run([str(_openpi_python()), "-c", CLIENT, url, key, str(size)], capture_output=True,
                          text=True, timeout=60)


def test_openpi_client_round_trip_with_api_key(host):
    srv = PolicyServer(host, ServeConfig(port=0, token="s3cret", reload_interval_s=0)).start()
    try:
        done = _run_client(srv.url, "s3cret")
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["numpy"].startswith("1.")  # really the client's own numpy < 2 environment
        assert out["meta"] == {"protocol": "openpi-websocket-msgpack-numpy", "chunk_len": 8, "action_dim": 4,
                               "image_size": 32, "policy_version": 3}
        assert out["actions"][:2] == [[8, 4], "float32"] and out["actions"][2] <= 1.0
        assert out["version"] == 3 and {"infer_ms", "total_ms"} <= set(out["timing"])
        assert out["error"].startswith("Error in inference server:\nbad request: ")  # openpi's text-frame error
        assert out["after_error"] == [8, 4]  # same connection still serves
        refused = _run_client(srv.url, "")  # no Authorization header: the upgrade is refused with HTTP 401
        assert refused.returncode != 0 and "401" in refused.stderr
        assert srv.stats["rejected_auth"] >= 1
    finally:
        srv.stop()


def test_healthz_and_auth_header(host, make_obs):
    srv = PolicyServer(host, ServeConfig(port=0, token="tok", reload_interval_s=0)).start()
    try:
        port = srv.port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:  # no token needed
            assert r.status == 200 and r.read() == b"OK\n"
        with pytest.raises(ConnectionError, match="401"):
            RemotePolicy(srv.url, api_key="wrong").connect()
        client = RemotePolicy(srv.url, api_key="tok")
        reply = client.infer(make_obs(client.metadata))
        assert reply["actions"].shape == (8, 4)
        client.close()
    finally:
        srv.stop()


def test_non_loopback_bind_requires_token():
    with pytest.raises(ValueError, match="token"):
        ServeConfig(host="0.0.0.0")
    assert ServeConfig(host="0.0.0.0", token="t").token == "t"
    assert ServeConfig().host == "127.0.0.1"


def test_codec_matches_openpi_conventions():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    raw = unpackb(packb({"a": arr}))  # our own decoder
    np.testing.assert_array_equal(raw["a"], arr)
    import msgpack
    plain = msgpack.unpackb(packb({"a": arr, "s": np.int64(4)}))  # the wire format openpi's unpack_array expects
    assert plain["a"][b"__ndarray__"] is True and plain["a"][b"dtype"] == "<f4" and plain["a"][b"shape"] == [2, 3]
    assert plain["s"][b"__npgeneric__"] is True
    for frame, match in [(b"\xc1", "not msgpack"),
                         (msgpack.packb({b"__ndarray__": True, b"data": b"\0" * 4, b"dtype": "|O", b"shape": [1]}),
                          "not allowed"),
                         (msgpack.packb({b"__ndarray__": True, b"data": b"\0" * 4, b"dtype": "<f4", b"shape": [9]}),
                          "needs 36 bytes")]:
        with pytest.raises(RequestError, match=match):
            unpackb(frame)


def test_obs_spec_rejects_with_named_fields():
    spec = ObsSpec(cameras=("front",), image_size=4, state_dim=2, action_dim=2, max_delay_steps=2)
    ok = {"image/front": np.zeros((4, 4, 3), np.uint8), "state": np.zeros(2), "instruction": "go"}
    batch = spec.to_batch(ok)
    assert batch["state"].dtype == np.float32 and batch["prefix"].shape == (1, 2, 2) and batch["delay_steps"][0] == 0
    cases = [({**ok, "state": np.array([np.nan, 0.0])}, "NaN"), ({**ok, "extra": 1}, "unknown request key"),
             ({**ok, "image/front": np.zeros((4, 4, 3), np.float32)}, "uint8"),
             ({**ok, "delay_steps": 1}, "prefix"), ({**ok, "instruction": ""}, "non-empty"),
             ({**ok, "delay_steps": 3, "prefix": np.zeros((2, 2))}, "delay_steps"), ([1, 2], "map")]
    for obs, match in cases:
        with pytest.raises(RequestError, match=match):
            spec.to_batch(obs)
    with_prefix = spec.to_batch({**ok, "delay_steps": np.int64(1), "prefix": np.array([[0.5, 0.5], [np.nan, 9]])})
    np.testing.assert_array_equal(with_prefix["prefix"][0], [[0.5, 0.5], [0.0, 0.0]])  # padding rows zeroed


def test_hot_reload_is_versioned(tmp_path, make_obs, write_ckpt):
    from robot_bridge.host import PolicyHost
    path = write_ckpt(tmp_path / "latest.pt", version=3)
    host = PolicyHost(path)
    srv = PolicyServer(host, ServeConfig(port=0, reload_interval_s=0.2)).start()
    try:
        client = RemotePolicy(srv.url)
        obs = make_obs(client.metadata)
        before = client.infer(obs)
        assert before["policy_version"] == 3
        write_ckpt(tmp_path / "latest.pt", version=7, seed=1)  # atomic rename, like acce train
        deadline = time.monotonic() + 10
        while client.infer(obs)["policy_version"] != 7:
            assert time.monotonic() < deadline, "newer checkpoint was not picked up"
            time.sleep(0.1)
        after = client.infer(obs)
        assert not np.allclose(after["actions"], before["actions"])
        assert client.metadata["policy_version"] == 3 and RemotePolicy(srv.url).metadata["policy_version"] == 7
        write_ckpt(tmp_path / "latest.pt", version=5)  # older: ignored
        time.sleep(0.6)
        assert client.infer(obs)["policy_version"] == 7 and host.stats["reloads"] == 1
        write_ckpt(tmp_path / "latest.pt", version=9, norm_seed=1)  # other normalization: refused
        time.sleep(0.6)
        assert client.infer(obs)["policy_version"] == 7 and host.stats["reload_refused"] == 1
        # a damaged file (written aside and renamed in, so the poller cannot also catch it empty mid-write and count
        # two errors, as it did once on a loaded machine): keeps serving
        (tmp_path / "bad.tmp").write_bytes(b"not a checkpoint")
        os.replace(tmp_path / "bad.tmp", tmp_path / "latest.pt")
        time.sleep(0.6)
        assert client.infer(obs)["policy_version"] == 7 and host.stats["reload_errors"] == 1
        with pytest.raises(PolicyError, match="bad request"):
            client.infer({"state": np.zeros(7)})
        client.close()
    finally:
        srv.stop()
        host.close()


def test_client_reports_unreachable_server():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError, match="cannot reach"):
        RemotePolicy(f"ws://127.0.0.1:{port}", open_timeout_s=1).connect()
