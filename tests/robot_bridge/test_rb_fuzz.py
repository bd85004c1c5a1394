"""Malformed input never hurts the server: each bad frame gets a text error on its own connection, which keeps
working, while another client is served throughout."""
import threading
import urllib.request

import msgpack
import numpy as np

from robot_bridge.protocol import packb
from robot_bridge.server import PolicyServer, ServeConfig


def _bad_frames(meta, make_obs, rng):
    good = make_obs(meta)
    frames = [rng.bytes(n) for n in (1, 7, 64, 4096)]  # random bytes
    frames += [b"", b"\x81", b"\xdd\xff\xff\xff\xff", b"\x91" * 5000]  # empty, truncated, huge array header, nesting
    frames += [packb(x) for x in (1, "text", [1, 2], None, {"state": 1}, {1: 2})]  # wrong top-level types
    frames += [packb({**good, "image/front": good["image/front"][:16]}),  # wrong shapes and dtypes
               packb({**good, "image/front": good["image/front"].astype(np.float64)}),
               packb({**good, "state": good["state"][:3]}),
               packb({**good, "state": good["state"].astype(np.int8)[:, None]}),
               packb({**good, "state": np.full(7, np.nan, np.float32)}), packb({**good, "state": np.full(7, np.inf)}),
               packb({**good, "instruction": 5}), packb({**good, "instruction": "x" * 5000}),
               packb({k: v for k, v in good.items() if k != "state"}), packb({**good, "bogus": np.zeros(2)}),
               packb({**good, "delay_steps": 99}), packb({**good, "delay_steps": 1}),
               packb({**good, "prefix": np.full((4, 4), np.nan, np.float32), "delay_steps": 2}),
               packb({**good, "prefix": np.zeros((9, 4), np.float32)})]
    frames += [msgpack.packb({"state": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": dt, b"shape": shape}})
               for dt, shape in (("|O", [1]), ("<U2", [1]), ("<f4", [10 ** 12]), ("<f4", [-1]), ("nope", [2]),
                                 ("<f4", "x"), ("V8", [1]))]
    frames.append(b"\0" * (70 * 1024))  # over max_request_bytes (64 KiB here): an error reply, not a disconnect
    return frames


def test_fuzzed_frames_get_errors_and_nobody_else_notices(host, make_obs):
    from websockets.sync.client import connect

    srv = PolicyServer(host, ServeConfig(port=0, reload_interval_s=0, max_request_bytes=64 * 1024)).start()
    try:
        meta = host.metadata()
        good = packb(make_obs(meta))
        stop, other = threading.Event(), {"ok": 0, "bad": 0}

        def other_client():  # a well-behaved robot, served the whole time
            with connect(srv.url, max_size=None, proxy=None) as ws:
                ws.recv(timeout=10)
                while not stop.is_set():
                    ws.send(good)
                    reply = ws.recv(timeout=10)
                    other["ok" if isinstance(reply, bytes) else "bad"] += 1

        thread = threading.Thread(target=other_client)
        thread.start()
        frames = _bad_frames(meta, make_obs, np.random.default_rng(0))
        with connect(srv.url, max_size=None, proxy=None) as ws:
            ws.recv(timeout=10)  # metadata
            for i, frame in enumerate(frames):
                ws.send(frame)
                reply = ws.recv(timeout=10)
                assert isinstance(reply, str) and reply.startswith("bad request: "), (i, reply)
                ws.send(good)  # the same connection is still fine
                assert isinstance(ws.recv(timeout=10), bytes), i
            ws.send("a text frame")
            assert ws.recv(timeout=10).startswith("bad request: send msgpack-numpy BINARY")
            rng = np.random.default_rng(1)
            mutated_bad = 0
            for _ in range(200):  # random byte flips in a valid frame: a reply or a bad-request error, nothing else
                frame = bytearray(good)
                for pos in rng.integers(0, len(frame), int(rng.integers(1, 4))):
                    frame[pos] = int(rng.integers(0, 256))
                ws.send(bytes(frame))
                reply = ws.recv(timeout=10)
                assert isinstance(reply, bytes) or reply.startswith("bad request: "), reply
                mutated_bad += isinstance(reply, str)
        stop.set()
        thread.join(timeout=20)
        assert other["bad"] == 0 and other["ok"] > 0
        assert srv.stats["bad_requests"] == len(frames) + 1 + mutated_bad and srv.stats["inference_errors"] == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        srv.stop()


def test_frame_over_hard_limit_closes_only_that_connection(host, make_obs):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    srv = PolicyServer(host, ServeConfig(port=0, reload_interval_s=0, max_request_bytes=16 * 1024)).start()
    try:
        good = packb(make_obs(host.metadata()))
        with connect(srv.url, max_size=None, proxy=None) as bystander, \
                connect(srv.url, max_size=None, proxy=None) as ws:
            bystander.recv(timeout=10)
            ws.recv(timeout=10)
            ws.send(b"\0" * (4 * 16 * 1024 + 1))  # beyond the websocket layer's limit: 1009 message too big
            try:
                ws.recv(timeout=10)
                raise AssertionError("connection should have been closed")
            except ConnectionClosed as closed:
                assert closed.rcvd is not None and closed.rcvd.code == 1009
            bystander.send(good)
            assert isinstance(bystander.recv(timeout=10), bytes)
    finally:
        srv.stop()
