"""`acce serve`: the policy server (openpi websocket protocol, see `robot_bridge.protocol`).

Why it is built this way:
- Inference never runs on the event loop (openpi #717: one slow client blocked all others). Each request is
  validated on the loop (cheap), then submitted to the host's batching `InferenceServer` thread and awaited, so
  concurrent clients share forward passes and a slow one delays nobody.
- Every failure is the sender's own: a malformed frame, a wrong key or shape, NaN, an oversize frame, or an
  inference error gets a one-line TEXT frame (openpi-client raises it as RuntimeError) and the connection stays
  open. Unlike openpi's server we do not close the connection after an error: a robot's next request is valid.
- Frames larger than `max_request_bytes` get an error reply. Frames larger than 4x that are refused by the
  websocket layer itself (close code 1009, message too big): buffering them just to say "too big" would let one
  client exhaust the server's memory. Other connections are unaffected either way.
- Loopback by default; any other bind address requires a token, checked on the `Authorization: Api-Key <token>`
  header that openpi-client sends (`WebsocketClientPolicy(api_key=...)`). `/healthz` answers "OK" without one.
"""
from __future__ import annotations

import asyncio
import hmac
import http
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from acce.device import INFERENCE_BACKENDS
from robot_bridge.protocol import RequestError, packb, unpackb

logger = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""bind addresses reachable only from this machine; anything else needs a token"""
ACTIVE_WINDOW_S = 1.0
"""a connection that sent a request this recently counts as an active client for batching"""


@dataclass(frozen=True)
class ServeConfig:
    """`acce serve` settings (the policy itself comes from the checkpoint)."""

    host: str = "127.0.0.1"
    """bind address; anything but loopback requires `token`"""
    port: int = 8000
    """TCP port (0 picks a free one; `PolicyServer.port` tells which)"""
    token: str | None = None
    """shared secret expected as `Authorization: Api-Key <token>`; None accepts any client (loopback only)"""
    max_request_bytes: int = 8 << 20
    """larger request frames get an error reply; 4x this is the websocket layer's hard limit"""
    reload_interval_s: float = 2.0
    """how often the checkpoint file is checked for a newer version (0 disables hot reload)"""
    deterministic: bool = True
    """serve the action mean (True) or a sample from the policy's Gaussian (False)"""
    max_batch: int = 16
    """most requests merged into one forward pass"""
    batch_timeout_ms: float = 2.0
    """how long the batching thread waits for more requests after the first one"""
    torch_threads: int = 1
    """torch intra-op threads of the serving process (see `PolicyHost`: 1 was 30-100x faster on 2 busy cores)"""
    inference_backend: str = "auto"
    """what runs vision + trunk: 'torch', 'onnxruntime' or 'auto' (ONNX Runtime on CPU where installed; re-exported
    when a reload changes the weights), as runtime.inference_backend"""

    def __post_init__(self) -> None:
        if self.host not in LOOPBACK_HOSTS and not self.token:
            raise ValueError(f"binding {self.host!r} exposes the robot policy to the network; pass a token "
                             "(--token T, sent by clients as 'Authorization: Api-Key T') or bind 127.0.0.1")
        if self.token is not None and not self.token.strip():
            raise ValueError("token must not be empty")
        if self.max_request_bytes < 1024:
            raise ValueError(f"max_request_bytes={self.max_request_bytes} is too small for any observation")
        if self.inference_backend not in INFERENCE_BACKENDS:
            raise ValueError(f"inference_backend must be one of {list(INFERENCE_BACKENDS)}, got "
                             f"{self.inference_backend!r}")
        if self.reload_interval_s < 0 or self.max_batch < 1 or self.batch_timeout_ms < 0:
            raise ValueError("reload_interval_s and batch_timeout_ms must be >= 0 and max_batch >= 1")


class PolicyServer:
    """Serves a `PolicyHost` over websockets. `start()` runs it on a background thread (tests, benchmarks);
    `serve_forever()` blocks (the CLI)."""

    def __init__(self, host, config: ServeConfig = ServeConfig()):
        self.host, self.config = host, config
        self.port: int | None = None
        self.stats = {"connections": 0, "open_connections": 0, "requests": 0, "replies": 0, "bad_requests": 0,
                      "inference_errors": 0, "rejected_auth": 0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_request: dict[int, float] = {}
        """connection id -> perf_counter of its latest request (who is actively asking for actions)"""

    @property
    def url(self) -> str:
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        return f"ws://{host}:{self.port}"

    # --- lifecycle -------------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> "PolicyServer":
        """Serve on a daemon thread; returns once the socket listens (raises what startup raised)."""
        ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve(ready)), name="policy-server",
                                        daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise TimeoutError(f"policy server did not start within {timeout_s} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # the loop closed in between
                pass
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def serve_forever(self, on_ready=None) -> None:
        """Block until SIGINT/SIGTERM (the CLI); on_ready(url) is called once the socket listens."""
        import signal

        async def main() -> None:
            ready = threading.Event()
            task = asyncio.create_task(self._serve(ready))
            while not ready.is_set():
                await asyncio.sleep(0.01)
            for sig in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(sig, self._stop.set)
            if on_ready is not None and self._error is None:
                on_ready(self.url)
            await task
        asyncio.run(main())
        if self._error is not None:
            raise self._error

    async def _serve(self, ready: threading.Event) -> None:
        from websockets.asyncio.server import serve

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            async with serve(self._handler, self.config.host, self.config.port, compression=None,
                             max_size=4 * self.config.max_request_bytes, process_request=self._process_request,
                             ping_interval=20, ping_timeout=20) as server:
                self.port = int(next(iter(server.sockets)).getsockname()[1])
                logger.info("serving %s (policy version %d) on %s", self.host.path, self.host.version, self.url)
                ready.set()
                reload_task = asyncio.create_task(self._reload_loop())
                await self._stop.wait()
                reload_task.cancel()
        except BaseException as err:  # startup failure (port in use): hand it to the caller of start()
            self._error = err
            ready.set()
            if not isinstance(err, Exception):
                raise

    # --- HTTP before the websocket upgrade -------------------------------------------------------------------
    def _process_request(self, connection, request):
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        token = self.config.token
        if token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Api-Key {token}".encode()):
                self.stats["rejected_auth"] += 1
                return connection.respond(http.HTTPStatus.UNAUTHORIZED,
                                          "missing or wrong 'Authorization: Api-Key <token>' header\n")
        return None

    # --- one connection --------------------------------------------------------------------------------------
    async def _handler(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        self.stats["connections"] += 1
        self.stats["open_connections"] += 1
        prev_total_ms: float | None = None
        try:
            await ws.send(packb(self.host.metadata()))
            async for message in ws:
                t0 = time.perf_counter()
                self.stats["requests"] += 1
                self._note_activity(id(ws), t0)
                reply = await self._answer(message)
                if isinstance(reply, str):
                    await ws.send(reply)
                    continue
                timing = reply.setdefault("server_timing", {})
                timing["total_ms"] = (time.perf_counter() - t0) * 1000.0
                if prev_total_ms is not None:
                    timing["prev_total_ms"] = prev_total_ms  # openpi's field: the previous request's total
                await ws.send(packb(reply))
                self.stats["replies"] += 1
                prev_total_ms = timing["total_ms"]
        except ConnectionClosed:
            pass
        finally:
            self.stats["open_connections"] -= 1
            self._last_request.pop(id(ws), None)

    def _note_activity(self, conn: int, now: float) -> None:
        """Batch for the clients that asked within the last second (an idle or monitoring connection must not
        make every request wait for a request that will not come; see `PolicyHost.set_active_clients`)."""
        self._last_request[conn] = now
        self.host.set_active_clients(sum(now - t < ACTIVE_WINDOW_S for t in self._last_request.values()))

    async def _answer(self, message: Any) -> dict[str, Any] | str:
        """A reply dict, or the one-line error text for this request."""
        try:
            if isinstance(message, str):
                raise RequestError("send msgpack-numpy BINARY frames (openpi_client.msgpack_numpy.packb), not text")
            if len(message) > self.config.max_request_bytes:
                raise RequestError(f"frame of {len(message)} bytes exceeds max_request_bytes="
                                   f"{self.config.max_request_bytes}; resize images on the client")
            t0 = time.perf_counter()
            batch = self.host.spec.to_batch(unpackb(message))
            t1 = time.perf_counter()
            result = await self.host.infer_async(batch)
            reply = self.host.reply(result, batch)
            reply["server_timing"] = {"decode_ms": (t1 - t0) * 1000.0,
                                      "infer_ms": (time.perf_counter() - t1) * 1000.0}
            return reply
        except RequestError as err:
            self.stats["bad_requests"] += 1
            return f"bad request: {err}"
        except Exception as err:  # the policy failed on a valid request: report it, keep serving
            self.stats["inference_errors"] += 1
            logger.exception("inference failed")
            return f"inference error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"

    async def _reload_loop(self) -> None:
        interval = self.config.reload_interval_s
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval)
            what = await asyncio.to_thread(self.host.reload_if_newer)
            if what:
                logger.warning("hot reload: %s", what)
