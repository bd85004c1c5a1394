#!/usr/bin/env bash
# The README's test command: set up .venv if needed, then run every test not marked gpu/robot.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec python -m pytest "$@"
