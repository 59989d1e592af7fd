#!/usr/bin/env bash
# The GPU check in one command, for a CUDA machine without internet (see bench/README.md):
#
#   bash bench/gpu_check.sh              # install what is missing from .whl/, then bench/gpu_check.py; 9 minutes
#   bash bench/gpu_check.sh --dry-run    # the same code on CPU with tiny shapes, in a few minutes
#   GPU_CHECK_OUT=/tmp/gpu.json bash bench/gpu_check.sh --models qwen3-0.6b   # gpu_check.py options pass through
#
# Missing packages (trl, datasets and what they need beyond the machine's own) are installed from the wheels that
# bench/fetch_wheels.sh put in .whl/, with --no-index: nothing is downloaded, and the installed torch, transformers,
# tokenizers, accelerate and huggingface_hub are held at their versions by a constraints file, so never replaced.
# The whole run, install included, keeps to a 9-minute deadline; results are written to $GPU_CHECK_OUT (default
# outputs/bench/gpu.json) after every case.
set -euo pipefail

cd "$(dirname "$0")/.."
start=$SECONDS
PYTHON=${PYTHON:-python3}
DEADLINE=${GPU_CHECK_DEADLINE:-540}

missing=$("$PYTHON" - <<'EOF'
import importlib.util
print(" ".join(name for name in ("trl", "datasets") if importlib.util.find_spec(name) is None))
EOF
)
if [[ -n "$missing" ]]; then
  if [[ ! -d .whl ]]; then
    echo "error: $missing not installed and no .whl/ folder; run bash bench/fetch_wheels.sh where pip works" >&2
    exit 2
  fi
  held=$(mktemp)
  trap 'rm -f "$held"' EXIT
  # the machine's own versions of what must never change (a package absent here is simply not held)
  "$PYTHON" -m pip list --format=freeze 2>/dev/null |
    grep -iE '^(torch|transformers|tokenizers|accelerate|huggingface[-_]hub|safetensors|peft|numpy)==' >"$held" || true
  echo "installing $missing from .whl/ (holding: $(tr '\n' ' ' <"$held"))"
  "$PYTHON" -m pip install --quiet --no-index --find-links .whl --constraint "$held" trl==1.16.0 datasets==5.2.0
fi

exec "$PYTHON" bench/gpu_check.py --deadline $((DEADLINE - (SECONDS - start))) "$@"
