"""`source scripts/setup.sh` (the README's advice) must leave the user's interactive shell as it was: no `set -e`
(the first failing command would close the terminal), no `set -u`, no change of directory."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sourcing_setup_keeps_the_callers_shell_options_and_directory(tmp_path):
    script = f'set +euo pipefail; cd "{tmp_path}"; source "{ROOT}/scripts/setup.sh" > /dev/null; ' \
             'echo "opts=$- pwd=$PWD"; false; echo "alive after a failing command"; command -v acce'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    opts = lines[0].split()[0].removeprefix("opts=")
    assert "e" not in opts and "u" not in opts, opts
    assert lines[0].split()[1] == f"pwd={tmp_path}"
    assert "alive after a failing command" in lines and lines[-1].endswith(".venv/bin/acce")
