"""Policies the robot runtime can call: `RemotePolicy` (a websocket client of `acce serve` or any openpi server)
and `LocalPolicy` (the same checkpoint in-process). Both have `metadata` and `infer(obs) -> reply`, one
unbatched observation in, one reply dict out (see `robot_bridge.protocol`).

`RemotePolicy` speaks exactly what `openpi_client.WebsocketClientPolicy` speaks, plus what a robot needs and that
client lacks: a timeout on every receive and reconnecting. After a timeout the connection is dropped, because a
late reply would otherwise be read as the answer to the next request.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from robot_bridge.protocol import packb, unpackb


class PolicyError(RuntimeError):
    """The server answered with an error text frame (the request was refused or inference failed)."""


class RemotePolicy:
    """Websocket client; not thread-safe (the runtime calls it from its one request thread)."""

    def __init__(self, url: str, *, api_key: str | None = None, open_timeout_s: float = 5.0,
                 request_timeout_s: float = 5.0):
        if not url.startswith(("ws://", "wss://")):
            raise ValueError(f"policy url {url!r} must start with ws:// or wss://, e.g. ws://127.0.0.1:8000")
        self.url, self.api_key = url, api_key
        self.open_timeout_s, self.request_timeout_s = open_timeout_s, request_timeout_s
        self._ws = None
        self._metadata: dict[str, Any] | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        """The server's metadata frame (connects on first use)."""
        if self._metadata is None:
            self.connect()
        return self._metadata

    def connect(self) -> dict[str, Any]:
        from websockets.sync.client import connect

        self.close()
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        try:
            ws = connect(self.url, compression=None, max_size=None, additional_headers=headers,
                         open_timeout=self.open_timeout_s, close_timeout=1.0, proxy=None)
        except Exception as err:
            raise ConnectionError(f"cannot reach the policy server at {self.url}: {type(err).__name__}: {err}"
                                  ) from None
        try:
            meta = unpackb(ws.recv(timeout=self.open_timeout_s))
        except Exception as err:
            ws.close()
            raise ConnectionError(f"{self.url} sent no metadata frame ({type(err).__name__}); is it a policy server?"
                                  ) from None
        if not isinstance(meta, dict):
            ws.close()
            raise ConnectionError(f"{self.url} sent metadata of type {type(meta).__name__}, expected a map")
        self._ws, self._metadata = ws, meta
        return meta

    def infer(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """One request; raises PolicyError (server-side error), TimeoutError or ConnectionError."""
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            self.connect()
        try:
            self._ws.send(packb(dict(obs)))
            reply = self._ws.recv(timeout=self.request_timeout_s)
        except TimeoutError:
            self.close()
            raise TimeoutError(f"no reply from {self.url} within {self.request_timeout_s} s") from None
        except (ConnectionClosed, OSError) as err:
            self.close()
            raise ConnectionError(f"connection to {self.url} lost: {type(err).__name__}: {err}") from None
        if isinstance(reply, str):
            raise PolicyError(reply)
        out = unpackb(reply)
        if not isinstance(out, dict) or "actions" not in out:
            raise PolicyError(f"reply from {self.url} has no 'actions'")
        return out

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:  # closing a broken connection must not mask the error being handled
                pass
            self._ws = None


class LocalPolicy:
    """The checkpoint in this process, with the server's validation and replies (`acce robot --checkpoint`)."""

    def __init__(self, checkpoint: str | os.PathLike, **host_kwargs: Any):
        from robot_bridge.host import PolicyHost
        self.host = PolicyHost(checkpoint, **host_kwargs)

    @property
    def metadata(self) -> dict[str, Any]:
        return self.host.metadata()

    def infer(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        from robot_bridge.protocol import RequestError
        try:
            return self.host.infer(obs)
        except RequestError as err:  # same contract as the remote path: a refused request is a PolicyError
            raise PolicyError(f"bad request: {err}") from None

    def close(self) -> None:
        self.host.close()
