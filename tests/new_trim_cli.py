"""Issue 26's small defects in the scripts' command lines: --help shows only real sections, and export.py's internal
tables are no settings.

.venv/bin/python -m pytest tests/new_trim_cli.py -q      # three subprocesses, no model: a few seconds each
"""

import re

import pytest
from conftest import run_script

from grpo import cli


@pytest.mark.parametrize("script", ["evaluate.py", "export.py", "grpotrainer.py"])
def test_help_prints_each_constant_under_a_section_and_no_stray_header(script):
    result = run_script(script, "--help")
    assert result.returncode == 0, result.stderr
    settings = result.stdout.split("settings (--KEY=value", 1)[1].split("\n--", 1)[0]
    blocks = [block for block in settings.split("\n\n") if block.strip()][1:]  # after the settings line itself
    # every section is a header followed by its constants: a wrapped comment would make a header with none
    for block in blocks:
        header, *body = block.splitlines()
        assert not header.startswith("  --") and body, f"stray header {header!r}"
        assert all(re.match(r"  --[A-Z][A-Z0-9_]*=|        \S", line) for line in body), block


def test_a_full_line_comment_after_a_constant_is_a_header(tmp_path):
    # the reason OUTPUT_DIR's comment must fit on its line: help_text cannot tell a wrapped comment from a header
    source = tmp_path / "s.py"
    source.write_text('"""S."""\n# ----\n# one\nA = 1  # a\n# two\nB = 2  # b\n# ----\n')
    text = cli.help_text(source)
    assert "\n one\n  --A=1\n        a\n\n two\n  --B=2\n        b" in text


def test_export_refuses_its_internal_table_names_as_settings():
    result = run_script("export.py", "--MARKER=notes.txt")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1  # one message, no traceback
    assert "unknown setting --MARKER" in result.stderr
