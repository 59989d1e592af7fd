#!/usr/bin/env bash
# The GPU check in one command, for a CUDA machine without internet (see bench/README.md):
#
#   bash bench/gpu_check.sh              # install what is missing from .whl/, then bench/gpu_check.py; <= 9 minutes
#   bash bench/gpu_check.sh --quick      # Qwen3-0.6B only (two steps' cases and decode); <= 5 minutes
#   bash bench/gpu_check.sh --dry-run    # the same code on CPU with tiny shapes, in a few minutes
#   GPU_CHECK_OUT=/tmp/gpu.json bash bench/gpu_check.sh --models qwen3-0.6b   # gpu_check.py options pass through
#
# The check runs in its own virtual environment ($GPU_CHECK_VENV, default one per Python under /tmp; kept for a rerun)
# that sees the machine's installed packages through a .pth file and holds only what the check adds: trl,
# datasets and what they need beyond the machine's own, installed from the wheels bench/fetch_wheels.sh put in
# .whl/ ($GPU_CHECK_WHEELS), with --no-index (nothing is downloaded) and every installed package held at its
# version by a constraints file, so never replaced. PYTHONPATH folders outside a site-packages folder are left out
# (said when it happens): packages put there with `pip install --target` break datasets, whose dill pickles such a
# pyarrow by value (PicklingError: Can't pickle <class 'MonthDayNano'>). The whole run, install included, keeps to
# gpu_check.py's deadline (540 s; --quick 300; GPU_CHECK_DEADLINE=seconds sets it); results go to $GPU_CHECK_OUT,
# default $OUT/gpu_check.json when $OUT is set, else outputs/bench/gpu_check.json, after every case, logs beside it.
# When the install (or gpu_check.py before its first case) fails, that JSON still comes back: the step that failed
# and the end of its log, and the exit status is not 0.
set -euo pipefail

cd "$(dirname "$0")/.."
start=$SECONDS
# the checkout's own environment when there is one (make install: the dry run on a development machine), else the
# machine's python3 (the GPU machine's preinstalled torch and transformers)
if [[ -z ${PYTHON:-} && -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; fi
PYTHON=${PYTHON:-python3}
# one venv per interpreter, kept for a rerun: a venv made over another Python would not see this one's packages
VENV=${GPU_CHECK_VENV:-${TMPDIR:-/tmp}/gpu-check-venv-$(realpath "$(command -v "$PYTHON")" 2>/dev/null | cksum | cut -d' ' -f1)}
WHEELS=${GPU_CHECK_WHEELS:-.whl}
if [[ -n ${GPU_CHECK_OUT:-} ]]; then out=$GPU_CHECK_OUT
elif [[ -n ${OUT:-} ]]; then out=$OUT/gpu_check.json
else out=outputs/bench/gpu_check.json; fi
logs=$(dirname "$out")/gpu_check-logs
mkdir -p "$logs"
rm -f "$out"  # a JSON left by an earlier run must not pass for this one's
log=$logs/install.log
: >"$log"

fail() {  # fail STEP WHY: write the JSON with the failure and the log's tail, then exit 1
  echo "error: $1: $2 (log: $log)" >&2
  tail -n 20 "$log" >&2 || true
  local p
  for p in "$PYTHON" python3 python; do  # the JSON needs only the standard library
    "$p" - "$out" "$1" "$2" "$log" <<'PY' 2>/dev/null && break
import datetime, json, sys
from pathlib import Path
out, step, why, log = sys.argv[1:5]
report = {
    "benchmark": "gpu_check",
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "failed_step": step,
    "error": why,
    "log": log,
    "log_tail": Path(log).read_text(errors="replace")[-4000:] if Path(log).is_file() else "",
    "cases": [],
    "failed": [step],
    "skipped": [],
    "complete": False,
}
Path(out).write_text(json.dumps(report, indent=2) + "\n")
PY
  done
  exit 1
}

kept=() dropped=()
IFS=: read -ra entries <<<"${PYTHONPATH:-}"
for entry in "${entries[@]}"; do
  [[ -z $entry ]] && continue
  if [[ $entry == *site-packages* ]]; then kept+=("$entry"); else dropped+=("$entry"); fi
done
if ((${#dropped[@]})); then
  echo "note: PYTHONPATH ${dropped[*]} left out: datasets' dill pickles packages outside site-packages by value" \
    "(PicklingError); the check installs its packages from $WHEELS into $VENV instead" >&2
fi
if ((${#kept[@]})); then PYTHONPATH=$(IFS=:; echo "${kept[*]}"); export PYTHONPATH; else unset PYTHONPATH; fi

if [[ ! -x $VENV/bin/python ]]; then
  # no pip of its own: the machine's pip (seen through the .pth file) installs into the venv it runs in
  { "$PYTHON" -m venv --without-pip "$VENV" &&
    "$PYTHON" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
      >"$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine.pth"
  } >>"$log" 2>&1 || fail venv "could not create the virtual environment $VENV with $PYTHON"
fi
py=$VENV/bin/python

missing=$("$py" -c 'import importlib.util as u; print(" ".join(n for n in ("trl", "datasets") if not u.find_spec(n)))' \
  2>>"$log") || fail venv "$py does not run"
if [[ -n "$missing" ]]; then
  [[ -d $WHEELS ]] || fail install "$missing not installed and no $WHEELS folder; run bash bench/fetch_wheels.sh where pip works"
  held=$(mktemp)
  trap 'rm -f "$held"' EXIT
  # everything installed stays at its version (torch, transformers, pyarrow, ...): pip may only add
  "$py" -m pip list --format=freeze 2>>"$log" | grep -E '^[A-Za-z0-9._-]+==' >"$held" || true
  echo "installing $missing from $WHEELS into $VENV (holding the $(wc -l <"$held") installed packages)"
  "$py" -m pip install --disable-pip-version-check --no-index --find-links "$WHEELS" --constraint "$held" \
    trl==1.16.0 datasets==5.2.0 >>"$log" 2>&1 || fail install "pip could not install $missing from $WHEELS"
fi

deadline=(${GPU_CHECK_DEADLINE:+--deadline "$GPU_CHECK_DEADLINE"})
log=$logs/gpu_check.log
status=0
"$py" bench/gpu_check.py "${deadline[@]}" --spent $((SECONDS - start)) "$@" 2> >(tee "$log" >&2) || status=$?
# gpu_check.py writes its JSON from the first case on; before that (bad options, an import error) this one says why
[[ -f $out ]] || fail gpu_check.py "exited with status $status before writing $out"
exit "$status"
