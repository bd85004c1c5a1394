"""Loading typed configs: YAML preset + dotted command-line overrides -> frozen dataclasses.

Decoding and type checking are draccus's (lerobot's config library, already a dependency); this module adds what
users hit first: unknown keys get a "did you mean" hint naming the full dotted path, and every error is one line.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config problem a user can fix; the message says how."""


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _check_keys(cls: type, data: Any, path: str) -> None:
    """Reject unknown keys anywhere in the tree, with the closest valid name as a hint."""
    if not isinstance(data, dict):
        return
    types = _field_types(cls)
    for key, value in data.items():
        if key not in types:
            close = difflib.get_close_matches(str(key), list(types), n=1, cutoff=0.5)
            hint = f"; did you mean '{path}{close[0]}'?" if close else f"; valid keys: {', '.join(sorted(types))}"
            raise ConfigError(f"unknown config key '{path}{key}'{hint}")
        sub = types[key]
        if dataclasses.is_dataclass(sub):
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"config key '{path}{key}' is a section; give its fields, e.g. {path}{key}.<field>=...")
            _check_keys(sub, value, f"{path}{key}.")


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """["learner.lr=3e-4", "env.tasks=[reach,push]"] -> [(key, yaml-parsed value)]."""
    parsed = []
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form section.key=value (e.g. learner.lr=3e-4)")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: cannot parse value ({exc.__class__.__name__})") from None
        parsed.append((key.strip(), value))
    return parsed


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Build a frozen config of type `cls` from defaults, a YAML preset and dotted overrides (in that order)."""
    import draccus

    tree: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist; presets live in configs/ (e.g. configs/default.yaml)")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a mapping of sections, got {type(loaded).__name__}")
        tree = loaded
    for key, value in parse_overrides(overrides or []):
        _set_dotted(tree, key, value)
    _check_keys(cls, tree, "")
    try:
        return draccus.decode(cls, tree)
    except Exception as exc:  # draccus wraps our __post_init__ errors; surface the innermost ConfigError
        inner: BaseException | None = exc
        while inner is not None and not isinstance(inner, ConfigError):
            inner = inner.__cause__ or inner.__context__
        message = str(inner if inner is not None else exc) or repr(exc)
        raise ConfigError(message.splitlines()[0]) from None


def to_dict(config: Any) -> dict:
    import draccus

    return draccus.encode(config)


def save_config(config: Any, path: str | Path) -> None:
    """Write the resolved config as YAML, atomically (write-then-rename)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    tmp.replace(path)


def field_docs(cls: type) -> dict[str, str]:
    """Field docstrings (the string literal under each field) of a config dataclass, for --help and docs."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def dataclass_from_dict(cls: type[T], d: dict, what: str) -> T:
    """A frozen config dataclass from JSON/YAML data: lists become tuples, unknown keys are one error naming the
    valid ones (shared by the robot-side configs that arrive as plain dicts)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"unknown {what} field(s) {unknown}; valid: {sorted(names)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
