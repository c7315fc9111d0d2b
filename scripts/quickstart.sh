#!/usr/bin/env bash
# One command on a fresh machine: set up, then generate with the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/octavo generate "${@:-Write a haiku about paging.}"
