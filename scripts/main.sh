#!/usr/bin/env bash
# The README's main command: set up .venv if needed, then run the main job (configs/default.yaml).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec acce train --config configs/default.yaml "$@"
