"""The helpers of grpotrainer.py, evaluate.py and export.py. Importing the package first checks the Python."""

import sys

if sys.version_info < (3, 11):  # noqa: UP036 (the check itself) before any module of ours compiles a pattern or a type that 3.10 cannot read
    print(
        f"\nerror: grpotrainer needs Python 3.11 or newer; this is {sys.version.split()[0]} ({sys.executable}).\n"
        "Run `make install` with python3.11 on PATH, then `.venv/bin/python grpotrainer.py ...`.\n",
        file=sys.stderr,
    )
    sys.exit(2)
