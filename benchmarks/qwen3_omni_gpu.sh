#!/usr/bin/env bash
# Issue 14, goal 5 on a GPU: the staged Qwen3-Omni pipeline against monolithic `generate`
# under open-loop Poisson arrivals, at the released Qwen3-Omni widths and depths with random
# weights (16 experts per MoE layer instead of 128, the released 8 / 6 active per token: the
# same compute per token; see omnictl/models/qwen3_omni/tiny.py). Sized to finish within
# 8 minutes on one large GPU (weights initialised on the GPU; three rates, 20 s of arrivals
# and at least 6 requests each);
# a hard limit stops it at 8 minutes regardless. CPU CI never runs it. A device session runs
# benchmarks/gpu_session.sh instead (this comparison at smaller sizes, beside the other GPU
# checks, in one call; docs/benchmarks/gpu-session.md).
#
#   bash benchmarks/qwen3_omni_gpu.sh [extra arguments for qwen3_omni_open_loop.py]
set -euo pipefail
cd "$(dirname "$0")/.."
# the project's venv where there is one; else (a GPU machine's image) its python3
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA GPU: this script is for a GPU machine")'
exec timeout --signal=INT 480 "$PYTHON" benchmarks/qwen3_omni_open_loop.py \
    --size real --device cuda --seconds 20 --requests 6 --multiples 0.5,1,2 --max-tokens 24 --max-codes 32 "$@"
