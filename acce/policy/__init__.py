"""Vision-language-action policy: config, instruction encoders, normalization statistics, the network.

`acce.config` imports `acce.policy.config`, which runs this file: it must not import torch. The heavy names are
resolved on first attribute access instead.
"""
from __future__ import annotations

from typing import Any

from acce.policy.config import LANG_DIM, PolicyConfig

_LAZY = {
    "VLAPolicy": "acce.policy.vla",
    "NormStats": "acce.policy.norm",
    "LanguageEncoder": "acce.policy.language",
    "MiniLMEncoder": "acce.policy.language",
    "HashEncoder": "acce.policy.language",
    "make_language_encoder": "acce.policy.language",
}

__all__ = ["LANG_DIM", "PolicyConfig", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'acce.policy' has no attribute {name!r}")
