"""The frozen part of a VLAPolicy (vision + trunk, the outputs in acce.policy.frozen.FROZEN_KEYS) run by ONNX Runtime
on CPU, for serving (runtime.inference_backend).

Why: on one core ONNX Runtime computes the default policy's vision + trunk in about half of torch eager's time (a
batch of 8: 5.3 against 10.6 ms; one row: 0.8 against 3.1 ms) with outputs within 1e-6 (docs/decisions.md, "Serving
runs vision and trunk in ONNX Runtime"). Serving needs no gradients, and while the frozen weights stay the same (a
run under learner.train_scope=residual, an evaluation, `acce serve`) one export serves every version; the heads, the
residual and the sampling stay in torch, so weight swaps never touch the exported graph.
"""
from __future__ import annotations

import io
import threading
import warnings
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from acce.policy.frozen import FROZEN_KEYS, frozen_stamp
from acce.types import AUX_KEY

CHECK_ATOL = 1e-4
"""largest |ONNX Runtime - torch| accepted on the export batch's frozen features; both run fp32, so more is a bug"""
_CACHE_SIZE = 4
_LOCK = threading.Lock()


def ort_available() -> bool:
    """Whether onnxruntime and onnx (torch's exporter needs it) import."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def applies_to(policy) -> str | None:
    """None if ONNX Runtime can serve this policy's frozen part, else why not (one line)."""
    if policy.device.type != "cpu":
        return f"the policy runs on {policy.device.type} (the ONNX path is CPU only)"
    if getattr(policy, "amp", False):
        return "the policy runs under mixed precision (the ONNX path is fp32)"
    if not ort_available():
        return "onnxruntime or onnx is not installed (pip install onnxruntime onnx)"
    return None


class _FrozenGraph(nn.Module):
    """VLAPolicy.frozen_outputs over positional tensors (what the exporter traces)."""

    def __init__(self, policy, names: tuple[str, ...], outputs: tuple[str, ...]) -> None:
        super().__init__()
        self.policy, self.names, self.outputs = policy, names, outputs

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.policy.frozen_outputs(dict(zip(self.names, tensors)))
        return tuple(out[k] for k in self.outputs)


class OnnxFrozen:
    """Callable: validated policy inputs (VLAPolicy._inputs) -> the frozen outputs as CPU tensors. Build it with
    `for_policy`, which exports once per frozen weights and checks the result against torch on the export batch."""

    def __init__(self, policy, x: Mapping[str, torch.Tensor], threads: int | None = None,
                 stamp: str | None = None) -> None:
        import onnxruntime as ort

        self.stamp = stamp or frozen_stamp(policy)
        """frozen_stamp of the weights it was exported from"""
        x = {k: v for k, v in x.items() if k != AUX_KEY}  # the privileged critic's input, never a frozen one
        names = tuple(sorted(x))
        args = tuple(x[k] for k in names)
        with torch.inference_mode():
            ref = policy.frozen_outputs(dict(x))
        self.outputs = tuple(k for k in FROZEN_KEYS if ref.get(k) is not None)
        graph = _FrozenGraph(policy, names, self.outputs).eval()
        buf = io.BytesIO()
        with warnings.catch_warnings(), torch.no_grad():
            # tracing warns about shape checks it freezes (fixed image size and grid) and about the legacy exporter
            warnings.simplefilter("ignore")
            torch.onnx.export(graph, args, buf, input_names=list(names), output_names=list(self.outputs),
                              dynamic_axes={k: {0: "batch"} for k in (*names, *self.outputs)}, opset_version=17,
                              dynamo=False)
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads or torch.get_num_threads())
        options.inter_op_num_threads = 1
        # spinning workers would take CPU from the simulators on a small machine
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(buf.getvalue(), options, providers=["CPUExecutionProvider"])
        self.inputs = tuple(i.name for i in self.session.get_inputs())  # inputs the graph does not read are dropped
        got = self(x)
        self.max_abs_diff = max(float((got[k] - ref[k]).abs().max()) for k in self.outputs)
        if not self.max_abs_diff <= CHECK_ATOL:
            raise RuntimeError(f"ONNX Runtime's frozen features differ from torch's by {self.max_abs_diff:.3g} "
                               f"(> {CHECK_ATOL}); serve with runtime.inference_backend=torch")

    def __call__(self, x: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        missing = [k for k in self.inputs if k not in x]
        if missing:
            raise ValueError(f"the exported frozen graph reads {list(self.inputs)}; this batch lacks {missing}")
        feed = {k: np.ascontiguousarray(x[k].detach().cpu().numpy()) for k in self.inputs}
        out = dict(zip(self.outputs, (torch.from_numpy(a) for a in self.session.run(list(self.outputs), feed))))
        return {k: out.get(k) for k in FROZEN_KEYS}

    _cache: "OrderedDict[tuple, OnnxFrozen]" = OrderedDict()
    _failed: dict[tuple, Exception] = {}

    @classmethod
    def for_policy(cls, policy, x: Mapping[str, torch.Tensor]) -> "OnnxFrozen":
        """The session for this policy's frozen weights and this input layout: made once and reused (evaluation
        builds a server per request on the same frozen weights; the newest _CACHE_SIZE are kept)."""
        key = (frozen_stamp(policy), tuple((k, v.dtype, tuple(v.shape[1:])) for k, v in sorted(x.items())
                                           if k != AUX_KEY),
               torch.get_num_threads())
        with _LOCK:
            if key in cls._cache:
                cls._cache.move_to_end(key)
                return cls._cache[key]
            if key in cls._failed:  # e.g. an evaluation server per request on weights that do not export
                raise cls._failed[key]
        try:
            made = cls(policy, x, stamp=key[0])
        except Exception as e:
            with _LOCK:
                cls._failed[key] = e.with_traceback(None)  # (a traceback would keep the policy alive)
                while len(cls._failed) > 4 * _CACHE_SIZE:
                    cls._failed.pop(next(iter(cls._failed)))
            raise
        with _LOCK:
            cls._cache[key] = made
            while len(cls._cache) > _CACHE_SIZE:
                cls._cache.popitem(last=False)
        return made
