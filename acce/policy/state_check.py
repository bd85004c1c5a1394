"""The check VLAPolicy runs before loading weights: one line that says which keys or shapes do not match."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np


def state_dict_mismatch(expected: Mapping[str, Any], given: Mapping[str, Any]) -> str:
    """'' when `given` has exactly the keys and shapes of `expected`, else a one-line description."""
    def few(names: list[str]) -> str:
        return str(names[:3])[:-1] + (f", … +{len(names) - 3} more]" if len(names) > 3 else "]")

    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    shapes = [f"{k} {tuple(np.shape(given[k]))} vs {tuple(expected[k].shape)}" for k in expected
              if k in given and tuple(np.shape(given[k])) != tuple(expected[k].shape)]
    parts = ([f"missing {few(missing)}"] if missing else []) + ([f"unexpected {few(unexpected)}"] if unexpected
                                                               else []) + ([f"shape {few(shapes)}"] if shapes else [])
    return "; ".join(parts)
