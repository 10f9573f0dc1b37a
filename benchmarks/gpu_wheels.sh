#!/usr/bin/env bash
# The wheels benchmarks/gpu_session.sh installs on a GPU device machine, which has no network:
# what omnictl's core needs that the device image (Python 3.12, torch 2.11, transformers
# 5.17, numpy, pyyaml, typer, rich, httpx, pillow, prometheus-client, ...) lacks or has at
# another version. Downloaded here, for CPython 3.12 on manylinux x86-64, into .gpu-wheels/
# (ignored by git; the device `run` call names it in `carry`). torch is never carried: the
# image's CUDA build is the one to use. vLLM's CUDA wheel is far too large to carry, so on
# the GPU the engine is the HF runner. About 20 MiB; the whole carry must stay under 64 MiB.
#
#   bash benchmarks/gpu_wheels.sh            # (re)creates .gpu-wheels/
#
# The versions are those scripts/setup.sh gives the project's .venv (transformers 5.24.0:
# the Qwen3-Omni code needs it); one version of each, or pip refuses the whole install.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.gpu-wheels
PIP="${PIP:-.venv/bin/pip}"
WHEELS=(
  transformers==5.24.0   # the image has 5.17; its dependencies there (hub 1.33, tokenizers 0.23.2, safetensors 0.8) satisfy 5.24
  regex==2026.11.19      # transformers 5.24 checks regex >= 2025.10.22 at import; the image's version is not known
  pyzmq==27.3.0
  msgspec==0.23.0
  jsonschema==4.26.0
  jsonschema-specifications==2025.9.1
  referencing==0.37.0
  rpds-py==2026.9.1
  platformdirs==4.14.9
  starlette==1.10.0
  uvicorn==0.55.0
  websockets==17.4
  python-multipart==0.0.34
)
rm -rf "$DEST"
mkdir -p "$DEST"
"$PIP" download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${WHEELS[@]}"
count=$(ls "$DEST"/*.whl | wc -l)
if [ "$count" -ne "${#WHEELS[@]}" ]; then
  echo "gpu_wheels: expected ${#WHEELS[@]} wheels in $DEST, found $count" >&2
  exit 1
fi
wheels=$(du -sb "$DEST" | cut -f1)
# what a device call sends: tracked and untracked-not-ignored files, plus what it carries
tree=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | awk 'END { print $1 }')
echo "gpu_wheels: $count wheels, $((wheels >> 20)) MiB in $DEST; with the working tree ($((tree >> 20)) MiB)" \
  "$(((wheels + tree) >> 20)) MiB of the 64 MiB a device call may send"
if [ $((wheels + tree)) -gt $((64 << 20)) ]; then
  echo "gpu_wheels: over the device call's 64 MiB: carry less, or ignore large untracked files" >&2
  exit 1
fi
