"""The package boundaries of docs/design.md §2, checked on the source: the deploy side (robot_bridge) imports no
training internals, and the neutral modules it does import stay light. That `import acce` alone pulls in no ray,
mujoco, lerobot or torch is tests/acce/test_config.py::test_import_acce_is_light."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("acce.runtime", "acce.train", "acce.wiring")
"""training internals: the runtime's roles and placement, the training driver, the CLI layer's factories"""


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, at any depth (lazy imports inside functions count too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            # "from acce import train" names the module in the alias
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return out


ROBOT_BRIDGE = sorted((ROOT / "robot_bridge").rglob("*.py"))


def test_the_walk_sees_lazy_and_from_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from acce import train\n    import acce.runtime.local as l\n")
    assert [m for _, m in imported_modules(f)] == ["acce", "acce.train", "acce.runtime.local"]


@pytest.mark.parametrize("path", ROBOT_BRIDGE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_robot_bridge_imports_no_training_internals(path):
    bad = [f"line {line}: {mod}" for line, mod in imported_modules(path)
           if any(mod == f or mod.startswith(f + ".") for f in FORBIDDEN)]
    assert not bad, f"{path.relative_to(ROOT)} imports training internals {bad}; use acce.serving, acce.policy, " \
                    "acce.types or acce.store instead (docs/design.md §2)"


def test_serving_modules_are_light():
    """What both sides import for chunk execution and serving must not drag in Ray or a simulator."""
    code = ("import acce.serving.timeline, acce.serving.inference, acce.policy.build, robot_bridge.protocol, sys; "
            "heavy = [m for m in ('ray', 'mujoco', 'lerobot', 'torch') if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
