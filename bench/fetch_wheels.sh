#!/usr/bin/env bash
# Download into .whl/ the wheels bench/gpu_check.sh needs on an offline CUDA machine, and nothing it already has.
#
#   bash bench/fetch_wheels.sh            # on a machine with pip access; then copy the checkout, .whl/ included
#   bash bench/fetch_wheels.sh /tmp/w     # into another folder
#   PYTHON=/path/to/python3.12 bash bench/fetch_wheels.sh   # else the first 3.12 that runs: PATH, pyenv, /usr, uv
#
# The target (the GPU machines we test on) runs Python 3.12 on Linux x86_64 with these preinstalled: torch 2.11
# (CUDA 13), transformers 5.17.0, accelerate 1.15, peft, pyarrow, pandas, tensorboard, safetensors, tokenizers 0.23
# and huggingface_hub 1.33.0. It lacks trl and datasets. The list to fetch is computed, not written down: pip resolves
# (--dry-run) what trl and datasets need on top of the preinstalled set, in a throwaway Python 3.12 environment where
# torch is only registered (a bare dist-info: the multi-GB CUDA wheel is never downloaded); the difference is then
# downloaded wheel by wheel with --no-deps, as manylinux2014 / manylinux_2_28 x86_64 wheels for CPython 3.12.
set -euo pipefail

DEST=${1:-.whl}
# what gpu_check.sh installs (requirements.txt's versions)
NEEDED=(trl==1.16.0 datasets==5.2.0)
# the image's own packages (pyarrow and pandas are most of what datasets would otherwise bring: ~60 MiB)
PREINSTALLED=(torch==2.11.0 transformers==5.17.0 accelerate==1.15.0 peft==0.21.2 pyarrow pandas tensorboard==2.21.0
  safetensors tokenizers huggingface_hub==1.33.0)
LIMIT_MIB=40  # the device machine's transfer carries 64 MiB with the checkout: keep well under it

find_python312() {  # the first Python 3.12 that runs: $PYTHON, PATH (a pyenv shim may fail), pyenv, system, uv
  local candidate
  for candidate in ${PYTHON:+"$PYTHON"} python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 \
    /root/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12 \
    $(command -v uv >/dev/null && uv python find 3.12 2>/dev/null); do
    if "$candidate" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  echo "error: no Python 3.12 found (tried \$PYTHON, python3.12, pyenv, /usr/local/bin, /usr/bin, uv);" \
    "set PYTHON=/path/to/python3.12" >&2
  return 1
}
PYTHON=$(find_python312)
echo "resolving with $PYTHON"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check)
# register torch 2.11.0 as installed without its wheel, so that nothing resolves (or downloads) a torch; its
# pure-Python requirements (torch 2.11's own list) stay, so that they count as preinstalled
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site/torch-2.11.0.dist-info"
{
  printf 'Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n'
  for req in filelock typing-extensions sympy networkx jinja2 fsspec setuptools; do echo "Requires-Dist: $req"; done
} >"$site/torch-2.11.0.dist-info/METADATA"
echo pip >"$site/torch-2.11.0.dist-info/INSTALLER"
: >"$site/torch-2.11.0.dist-info/RECORD"

resolve() {  # the name==version pins pip would install for "$@" (a dry run: metadata only)
  "${pip[@]}" install --quiet --dry-run --only-binary=:all: --report "$work/report.json" "$@" >/dev/null
  "$work/venv/bin/python" -c '
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    print(meta["name"].lower().replace("_", "-") + "==" + meta["version"])
' "$work/report.json" | sort
}

resolve "${PREINSTALLED[@]}" >"$work/preinstalled.txt"
resolve "${PREINSTALLED[@]}" "${NEEDED[@]}" >"$work/all.txt"
comm -13 "$work/preinstalled.txt" "$work/all.txt" >"$work/missing.txt"
echo "wheels to fetch ($(wc -l <"$work/missing.txt")): $(tr '\n' ' ' <"$work/missing.txt")"

mkdir -p "$DEST"
"${pip[@]}" download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any -d "$DEST" -r "$work/missing.txt"

total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "$DEST: $(ls "$DEST"/*.whl | wc -l) wheels, $((total / 1024 / 1024)) MiB"
if ((total >= LIMIT_MIB * 1024 * 1024)); then
  echo "error: the wheels exceed ${LIMIT_MIB} MiB" >&2
  exit 1
fi
