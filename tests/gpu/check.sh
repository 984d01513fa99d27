#!/usr/bin/env bash
# The device check (docs/gpu-quickstart.md): real training steps of a ~0.5B Qwen2-shaped model with
# random weights on one H100/H200, <= 8 minutes, nothing downloaded. Prints one JSON object
# (tokens/s, seconds per step, peak GPU memory, publish times) and writes it to $OUT/gpu_check.json.
#
# The lent machine has torch, transformers, accelerate and safetensors but none of AstraFlow's
# other dependencies and no network: carry them as wheels in .wheels/ (ignored by git), built here
# for its Python 3.12:
#   pip download --only-binary=:all: --python-version 3.12 --no-deps -d .wheels \
#     trl==1.16.0 datasets gymnasium fastapi starlette uvicorn httpx httpcore h11 anyio sniffio \
#     msgpack pydantic pydantic-core annotated-types typing-inspection typer click rich \
#     shellingham pygments markdown-it-py mdurl prometheus-client psutil cryptography cffi \
#     pycparser multiprocess dill xxhash pyarrow pandas cloudpickle farama-notifications
# then, with the device tool: run(command="bash tests/gpu/check.sh", carry=[".wheels"]).
# On a CPU: `python tests/gpu/gpu_check.py --size tiny --device cpu` (a fast-tier test runs it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT="${OUT:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
if [ -d .wheels ]; then
  "$PY" -m pip install -q --no-index --no-deps .wheels/*.whl
fi
# AstraFlow itself from the checkout (its folders map to astraflow.*; no dependency resolution)
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.cuda.get_device_name(), torch.__version__)'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 480 "$PY" tests/gpu/gpu_check.py --out "$OUT/gpu_check.json" "$@"
