#!/usr/bin/env bash
# Create/refresh the project's virtual environment (.venv) idempotently; sourced by main.sh and test.sh, or by a user
# (`source scripts/setup.sh`) to get the `acce` command. Second runs are fast: the install is skipped while
# pyproject.toml is unchanged. The install runs in a subshell with strict error handling, so sourcing it leaves the
# caller's shell options and working directory alone; only the environment variables below are set.
ACCE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_acce_install() (
set -euo pipefail
ROOT="$ACCE_ROOT"
cd "$ROOT"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
  echo "acce needs Python 3.11 (lerobot 0.4.4 and our pins); found $("$PY" --version 2>&1). Set PYTHON=..." >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
STAMP=.venv/.acce-install-stamp
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  # The environment is ~9.5 GB (torch's CUDA libraries come with the registry wheel) and pip needs room to unpack
  # wheels: check first so that a full disk gives one clear error instead of an OSError halfway through the install.
  NEED_GB="${ACCE_SETUP_NEED_GB:-12}"
  for DIR in "$ROOT" "${TMPDIR:-/tmp}"; do
    FREE_GB=$(( $(df -Pk "$DIR" | awk 'NR==2 {print $4}') / 1048576 ))
    if [ "$FREE_GB" -lt "$NEED_GB" ]; then
      echo "[setup] only ${FREE_GB} GB free on the file system of $DIR; installing acce's environment needs about" \
        "${NEED_GB} GB. Free some space (old clones, runs/, pip caches) or point TMPDIR elsewhere, then re-run." >&2
      exit 1
    fi
  done
  echo "[setup] installing acce and its dependencies into .venv (first run takes a few minutes)"
  .venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -m pip install --quiet -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -m pip check
  .venv/bin/python -c "import acce, sim, mujoco, ray, lerobot, transformers, zarr, torch" \
    || { echo "[setup] install incomplete" >&2; exit 1; }
  echo "$WANT" > "$STAMP"
fi
# System packages: video LeRobotDatasets decode through torchcodec, which loads Debian's FFmpeg 5 shared libraries
# (image datasets and everything else work without them). Installed when missing and this shell may (root, apt-get);
# otherwise a note says what to install. Skipped in a second when present.
FFMPEG_PKGS="libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4 libavdevice59 libavfilter8"
SHARED_LIBS="$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)"  # not piped: grep -q + pipefail
if ! grep -qE 'libavutil\.so\.(5[6-9]|60) ' <<< "$SHARED_LIBS"; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    echo "[setup] installing FFmpeg libraries for video datasets: $FFMPEG_PKGS"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        $FFMPEG_PKGS; } > /dev/null 2>&1 \
      || echo "[setup] warning: could not install $FFMPEG_PKGS; video LeRobotDatasets will decode through" \
        "PyAV instead of torchcodec (slower)" >&2
  else
    echo "[setup] note: video LeRobotDatasets decode with torchcodec (else PyAV) given: sudo apt-get install -y" \
      "--no-install-recommends $FFMPEG_PKGS" >&2
  fi
fi
# openpi-client pins numpy<2: the robot-side protocol test runs it from its own environment, as a robot would.
bash "$ROOT/scripts/setup_openpi.sh"
)
# Called plainly (not in an `if`): inside a condition bash ignores `set -e`, even in the subshell. A caller with
# `set -e` (main.sh, test.sh) stops here on failure; an interactive shell gets the message and a non-zero return.
_acce_install
_acce_rc=$?
unset -f _acce_install
if [ "$_acce_rc" -ne 0 ]; then
  echo "[setup] failed (exit $_acce_rc); fix the message above and re-run" >&2
  unset _acce_rc
  return 1 2>/dev/null || exit 1
fi
unset _acce_rc
# Offscreen MuJoCo rendering through EGL (Mesa) and no model-hub downloads at run time.
export MUJOCO_GL="${MUJOCO_GL:-egl}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export PATH="$ACCE_ROOT/.venv/bin:$PATH"
