#!/usr/bin/env bash
# Create/refresh .venv-openpi: the unmodified openpi-client in its own environment, as a robot machine would have it.
# openpi-client pins numpy<2, which cannot live next to acce's numpy 2, so the protocol test runs the client from here.
# Idempotent: skipped while the stamp matches the requested version.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
SPEC="${OPENPI_CLIENT_SPEC:-openpi-client}"
# openpi-client 0.1.2 imports typing_extensions without declaring it, so it is installed explicitly.
EXTRA="typing-extensions"
VENV=.venv-openpi
STAMP="$VENV/.acce-openpi-stamp"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$SPEC $EXTRA" ] || [ ! -x "$VENV/bin/python" ]; then
  echo "[setup_openpi] installing $SPEC into $VENV"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$SPEC" $EXTRA 2>&1 | grep -v "^WARNING: Location" || true
  "$VENV/bin/python" -c "from openpi_client import websocket_client_policy, msgpack_numpy" \
    || { echo "[setup_openpi] openpi-client did not install into $VENV" >&2; exit 1; }
  echo "$SPEC $EXTRA" > "$STAMP"
fi
