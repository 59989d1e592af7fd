#!/usr/bin/env bash
# The GPU check in one command, for a CUDA machine without internet (see bench/README.md):
#
#   bash bench/gpu_check.sh              # install what is missing from .whl/, then bench/gpu_check.py; <= 6 minutes
#   bash bench/gpu_check.sh --quick      # Qwen3-0.6B only (calibrate, decode, two steps); <= 4.5 minutes
#   bash bench/gpu_check.sh --dry-run    # the same code on CPU with tiny shapes, in a few minutes
#   GPU_CHECK_OUT=/tmp/gpu.json bash bench/gpu_check.sh --models qwen3-0.6b   # gpu_check.py options pass through
#
# The check runs in its own virtual environment ($GPU_CHECK_VENV, default /tmp/gpu-check-venv; kept for a rerun)
# that sees the machine's installed packages through a .pth file and holds only what the check adds: trl,
# datasets and what they need beyond the machine's own, installed from the wheels bench/fetch_wheels.sh put in
# .whl/, with --no-index (nothing is downloaded) and every installed package held at its version by a constraints
# file, so never replaced. PYTHONPATH folders outside a site-packages folder are left out (said when it happens):
# packages put there with `pip install --target` break datasets, whose dill pickles such a pyarrow by value
# (PicklingError: Can't pickle <class 'MonthDayNano'>). The whole run, install included, keeps to gpu_check.py's
# deadline (6 minutes; --quick 4.5; GPU_CHECK_DEADLINE=seconds sets it); results go to $GPU_CHECK_OUT, default
# $OUT/gpu_check.json when $OUT is set, else outputs/bench/gpu_check.json, after every case, logs beside it.
set -euo pipefail

cd "$(dirname "$0")/.."
start=$SECONDS
PYTHON=${PYTHON:-python3}
VENV=${GPU_CHECK_VENV:-${TMPDIR:-/tmp}/gpu-check-venv}

kept=() dropped=()
IFS=: read -ra entries <<<"${PYTHONPATH:-}"
for entry in "${entries[@]}"; do
  [[ -z $entry ]] && continue
  if [[ $entry == *site-packages* ]]; then kept+=("$entry"); else dropped+=("$entry"); fi
done
if ((${#dropped[@]})); then
  echo "note: PYTHONPATH ${dropped[*]} left out: datasets' dill pickles packages outside site-packages by value" \
    "(PicklingError); the check installs its packages from .whl/ into $VENV instead" >&2
fi
if ((${#kept[@]})); then PYTHONPATH=$(IFS=:; echo "${kept[*]}"); export PYTHONPATH; else unset PYTHONPATH; fi

if [[ ! -x $VENV/bin/python ]]; then
  # no pip of its own: the machine's pip (seen through the .pth file) installs into the venv it runs in
  "$PYTHON" -m venv --without-pip "$VENV"
  "$PYTHON" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
    >"$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine.pth"
fi
py=$VENV/bin/python

missing=$("$py" - <<'EOF'
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
  # everything installed stays at its version (torch, transformers, pyarrow, ...): pip may only add
  "$py" -m pip list --format=freeze 2>/dev/null | grep -E '^[A-Za-z0-9._-]+==' >"$held" || true
  echo "installing $missing from .whl/ into $VENV (holding the $(wc -l <"$held") installed packages)"
  "$py" -m pip install --quiet --disable-pip-version-check --no-index --find-links .whl --constraint "$held" \
    trl==1.16.0 datasets==5.2.0
fi

deadline=(${GPU_CHECK_DEADLINE:+--deadline "$GPU_CHECK_DEADLINE"})
exec "$py" bench/gpu_check.py "${deadline[@]}" --spent $((SECONDS - start)) "$@"
