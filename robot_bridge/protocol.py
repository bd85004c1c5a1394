"""The wire protocol: openpi's websocket policy protocol with acce's observation keys (docs/design.md §3).

Frames are msgpack with openpi-client's numpy convention (`openpi_client.msgpack_numpy`): an array is a map
{b"__ndarray__": True, b"data": raw bytes, b"dtype": dtype.str, b"shape": shape}, a numpy scalar is
{b"__npgeneric__": True, b"data": value, b"dtype": dtype.str}. So the unmodified `WebsocketClientPolicy` talks to
our server and our client talks to openpi servers.

    server -> client, once on connect:  metadata map (see `PolicyHost.metadata`); "env_spec" is the policy's
                                         acce.types.EnvSpec as a dict (widths, action representation, control rate,
                                         cameras, image size), which the robot runtime requires
    client -> server, per request:       one UNBATCHED observation (openpi style)
        "image/<camera>"  uint8 (H, W, 3), H = W = metadata["image_size"] (resize on the client)
        "state"           float (S,) raw proprioception, finite
        "instruction"     str (openpi's "prompt" is accepted as a synonym)
        "prefix"          float (D, A) committed actions, optional (zeros);  "delay_steps" int in [0, D], optional
    server -> client, per reply:         {"actions": float32 (H, A) in [-1, 1], "policy_version": int,
                                          "delay_steps": int, "server_timing": {"infer_ms", "total_ms", ...}}
    errors: a TEXT frame with one line (openpi-client raises RuntimeError on text); the connection stays open.

Decoding never trusts the sender: dtypes are limited to bool/int/uint/float, the declared shape must match the
byte count, and every failure becomes `RequestError` with a message that names the field and the fix.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import msgpack
import numpy as np

from acce.types import IMAGE_PREFIX, INSTRUCTION_KEY, STATE_KEY, EnvSpec

PROTOCOL = "openpi-websocket-msgpack-numpy"
"""what metadata["protocol"] says, so a client can tell it is talking to the protocol it expects"""
PROMPT_KEY = "prompt"
"""openpi's name for the instruction; accepted as a synonym of "instruction\""""
PREFIX_KEY = "prefix"
DELAY_KEY = "delay_steps"
_ALLOWED_KINDS = "biuf"
"""dtype kinds a frame may carry: bool, int, uint, float (no objects, strings, voids or complex)"""


class RequestError(ValueError):
    """A malformed request: the client gets this message as a text frame; the connection stays open."""


def served_env_spec(metadata: Mapping[str, Any]) -> EnvSpec:
    """The env spec a policy server advertises; ValueError (one line) when its metadata has none, because a robot
    must not guess the control rate or the widths of the policy it runs."""
    if not isinstance(metadata.get("env_spec"), Mapping):
        raise ValueError("the policy server's metadata has no env_spec (an acce serve older than the env spec, or "
                         "not an acce server): the robot cannot know the policy's control rate and widths; "
                         "serve the checkpoint with this version of acce serve")
    return EnvSpec.from_dict(metadata["env_spec"])


# --- msgpack-numpy (openpi_client.msgpack_numpy conventions) -----------------------------------------------------
def _pack_default(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind not in _ALLOWED_KINDS:
        raise TypeError(f"cannot send numpy dtype {obj.dtype} (only bool/int/uint/float)")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot msgpack {type(obj).__name__}")


def _unpack_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        dtype, shape, data = _dtype(obj.get(b"dtype")), obj.get(b"shape"), obj.get(b"data")
        if not isinstance(data, bytes) or not isinstance(shape, (list, tuple)) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise RequestError("array frame needs bytes 'data' and a list of non-negative int 'shape'")
        if math.prod(shape) * dtype.itemsize != len(data):
            raise RequestError(f"array frame: shape {tuple(shape)} of {dtype} needs "
                               f"{math.prod(shape) * dtype.itemsize} bytes, got {len(data)}")
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if b"__npgeneric__" in obj:
        try:
            return _dtype(obj.get(b"dtype")).type(obj.get(b"data"))
        except (TypeError, ValueError, OverflowError) as err:
            raise RequestError(f"numpy scalar frame: {err}") from None
    return obj


def _dtype(spec: Any) -> np.dtype:
    try:
        dtype = np.dtype(spec.decode() if isinstance(spec, bytes) else spec)
    except (TypeError, ValueError, AttributeError, UnicodeDecodeError):
        raise RequestError(f"array frame has an invalid dtype {spec!r}") from None
    if dtype.kind not in _ALLOWED_KINDS or dtype.hasobject or dtype.itemsize == 0:
        raise RequestError(f"array dtype {dtype} is not allowed; send bool, int, uint or float arrays")
    return dtype


def packb(obj: Any) -> bytes:
    """msgpack bytes of a (nested) dict with numpy arrays, readable by openpi_client.msgpack_numpy.unpackb."""
    return msgpack.packb(obj, default=_pack_default, use_bin_type=True)


def unpackb(data: bytes) -> Any:
    """Decode a frame; any malformation raises RequestError (never another exception type)."""
    try:
        return msgpack.unpackb(data, object_hook=_unpack_hook, raw=False, strict_map_key=False)
    except RequestError:
        raise
    except Exception as err:  # msgpack raises many types (ExtraData, FormatError, StackError, ValueError, ...)
        raise RequestError(f"frame is not msgpack-numpy ({type(err).__name__}: {str(err)[:120]})") from None


# --- observation validation --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ObsSpec:
    """What one request must look like for the served policy; built from the checkpoint (see `PolicyHost`)."""

    cameras: tuple[str, ...]
    """camera names; the request carries obs["image/<camera>"] for each, no others"""
    image_size: int
    """H = W of every camera image, in pixels (the client resizes)"""
    state_dim: int
    """S: length of obs["state"]"""
    action_dim: int
    """A: width of every action (and of the committed prefix)"""
    max_delay_steps: int
    """D: rows of the committed prefix; 0 means the policy takes no prefix"""
    max_instruction_chars: int = 1024
    """longer instructions are refused (they would only be truncated by the language encoder)"""

    @property
    def keys(self) -> tuple[str, ...]:
        """every key a request may carry"""
        cams = tuple(IMAGE_PREFIX + c for c in self.cameras)
        delay = (PREFIX_KEY, DELAY_KEY) if self.max_delay_steps else ()
        return cams + (STATE_KEY, INSTRUCTION_KEY, PROMPT_KEY) + delay

    def to_batch(self, obs: Any) -> dict[str, Any]:
        """Validate one unbatched observation and return a batch of one row for `InferenceServer.submit`.

        Every batch has exactly the same keys, dtypes and trailing shapes, so concurrent requests can always be
        concatenated: one client's request can never break another's batch.
        """
        if not isinstance(obs, Mapping):
            raise RequestError(f"request must be a map of observation keys, got {type(obs).__name__}")
        bad = sorted(str(k) for k in obs if k not in self.keys)
        if bad:
            raise RequestError(f"unknown request key(s) {bad[:5]}; accepted: {list(self.keys)}")
        batch: dict[str, Any] = {}
        for cam in self.cameras:
            key = IMAGE_PREFIX + cam
            img = _array(obs, key, f"uint8 ({self.image_size}, {self.image_size}, 3) camera pixels")
            if img.dtype != np.uint8 or img.shape != (self.image_size, self.image_size, 3):
                raise RequestError(f"{key!r} must be uint8 ({self.image_size}, {self.image_size}, 3), got "
                                   f"{img.dtype} {img.shape}; resize on the client "
                                   "(openpi_client.image_tools.resize_with_pad)")
            batch[key] = img[None]
        state = _array(obs, STATE_KEY, f"float ({self.state_dim},) proprioception")
        if state.dtype.kind not in "fiu" or state.shape != (self.state_dim,):
            raise RequestError(f"'state' must be a float array of shape ({self.state_dim},), got {state.dtype} "
                               f"{state.shape}")
        state = state.astype(np.float32)
        if not np.all(np.isfinite(state)):
            raise RequestError("'state' contains NaN/inf; check the robot's sensors before asking for actions")
        batch[STATE_KEY] = state[None]
        batch[INSTRUCTION_KEY] = [self._instruction(obs)]
        if self.max_delay_steps:
            batch[PREFIX_KEY], batch[DELAY_KEY] = self._prefix(obs)
        return batch

    def _instruction(self, obs: Mapping) -> str:
        if INSTRUCTION_KEY in obs and PROMPT_KEY in obs:
            raise RequestError("send either 'instruction' or 'prompt', not both")
        text = obs.get(INSTRUCTION_KEY, obs.get(PROMPT_KEY))
        if isinstance(text, np.ndarray) and text.dtype.kind == "u" and text.ndim == 1:
            raise RequestError("'instruction' must be a str, got a byte array")
        if not isinstance(text, str) or not text.strip():
            raise RequestError(f"'instruction' (or 'prompt') must be a non-empty str, got {type(text).__name__}")
        if len(text) > self.max_instruction_chars:
            raise RequestError(f"'instruction' has {len(text)} characters; the limit is {self.max_instruction_chars}")
        return text

    def _prefix(self, obs: Mapping) -> tuple[np.ndarray, np.ndarray]:
        d_max, a = self.max_delay_steps, self.action_dim
        delay = obs.get(DELAY_KEY, 0)
        if isinstance(delay, np.ndarray) and delay.shape in ((), (1,)):
            delay = delay.reshape(())[()]
        if isinstance(delay, (bool, np.bool_)) or not isinstance(delay, (int, np.integer)) or not 0 <= delay <= d_max:
            raise RequestError(f"'delay_steps' must be an int in [0, {d_max}], got {delay!r}")
        prefix = np.zeros((d_max, a), np.float32)
        if PREFIX_KEY in obs:
            given = _array(obs, PREFIX_KEY, f"float ({d_max}, {a}) committed actions")
            if given.dtype.kind != "f" or given.ndim != 2 or given.shape[1] != a or given.shape[0] > d_max:
                raise RequestError(f"'prefix' must be float (n <= {d_max}, {a}), got {given.dtype} {given.shape}")
            if given.shape[0] < delay:
                raise RequestError(f"'prefix' has {given.shape[0]} rows but 'delay_steps'={delay} committed ones")
            prefix[:given.shape[0]] = given
        elif delay > 0:
            raise RequestError(f"'delay_steps'={delay} needs the committed 'prefix' ({d_max}, {a}) as well")
        if not np.all(np.isfinite(prefix[:int(delay)])):
            raise RequestError("'prefix' has NaN/inf in its committed rows")
        prefix[int(delay):] = 0.0  # rows past d are padding: never let them carry garbage into the batch
        return prefix[None], np.array([int(delay)], np.int64)


def _array(obs: Mapping, key: str, what: str) -> np.ndarray:
    if key not in obs:
        raise RequestError(f"request is missing {key!r} ({what})")
    value = obs[key]
    if not isinstance(value, np.ndarray):
        raise RequestError(f"{key!r} must be a numpy array ({what}), got {type(value).__name__}")
    return value
