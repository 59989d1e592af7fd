"""Where code lives and how settings travel: four files at the root, the helpers in grpo/, scripts that share the
package and never import each other or write its globals, and a training script that reads in one sitting.

.venv/bin/python -m pytest tests/test_structure.py -q
"""

import ast
import re

import pytest
from conftest import REPO

ROOT_FILES = {"grpotrainer.py", "rewards.py", "evaluate.py", "export.py"}  # what a user runs or edits
SCRIPTS = {"grpotrainer", "evaluate", "export"}
PACKAGE = REPO / "grpo"
DEMO = REPO / "demo"  # the --demo profile's task and warm start: not a helper of training
MODULES = sorted([*REPO.glob("*.py"), *PACKAGE.glob("*.py"), *DEMO.glob("*.py")])


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node, [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            yield node, [node.module or ""]


def test_the_root_holds_only_what_a_user_runs_or_edits():
    assert {p.name for p in REPO.glob("*.py")} == ROOT_FILES
    assert (PACKAGE / "__init__.py").is_file()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_imports_a_script_or_writes_globals(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    in_package = path.parent == PACKAGE
    for node, names in _imports(tree):
        assert not set(names) & (SCRIPTS - {path.stem}), f"{path.name}:{node.lineno} imports a script"
        # the package serves the scripts and rewards.py; it never reaches back into the root
        assert not (in_package and set(names) & {"rewards", "demo", "demo.sums"}), f"{path.name}:{node.lineno}"
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Global), f"{path.name}:{node.lineno} uses `global`"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            target = node.args[0]
            assert not (isinstance(target, ast.Name) and target.id in SCRIPTS), f"{path.name}:{node.lineno}"


@pytest.mark.parametrize("name", ["checkpoints", "files", "grading", "cli", "gsm8k", "preflight", "hardware"])
def test_shared_modules_import_no_heavy_library_at_the_top(name):
    # five modules need the checkpoint checks; one caller's callback must not make them all import transformers
    tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
    top = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
    top += [node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)]
    heavy = {"torch", "transformers", "trl", "peft", "datasets", "accelerate", "vllm"}
    assert not {name.partition(".")[0] for name in top} & heavy


def test_the_training_script_reads_in_one_sitting():
    # the goal is about 300 lines written plainly (STYLE.md); the bounds below leave slack on purpose, so that
    # nobody packs code to meet them: what they catch is a script that has stopped reading in one sitting
    text = (REPO / "grpotrainer.py").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 360
    assert sum(len(line) > 100 for line in lines) <= len(lines) // 5  # mostly short lines
    tree = ast.parse(text)
    for node in ast.walk(tree):
        # one assignment per line: no tuple-packed `a, b = x, y`
        if isinstance(node, ast.Assign):
            packed = any(isinstance(t, ast.Tuple) for t in node.targets) and isinstance(node.value, ast.Tuple)
            assert not packed, f"grpotrainer.py:{node.lineno} packs several assignments in one"
        # keyword arguments where a call passes more than three values, and no positional splats
        if isinstance(node, ast.Call):
            positional = [a for a in node.args if not isinstance(a, ast.Starred)]
            assert not any(isinstance(a, ast.Starred) for a in node.args), f"grpotrainer.py:{node.lineno} splats"
            logging_call = getattr(node.func, "attr", "") in ("debug", "info", "warning", "error")  # format args
            assert len(positional) <= 3 or logging_call, f"grpotrainer.py:{node.lineno} passes values by position"
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert main.end_lineno - main.lineno + 1 <= 50  # main() reads top to bottom in about thirty lines


def test_the_readme_fits_a_sitting():
    # about 200 lines, under 16 KB, is the goal (STYLE.md); the bound leaves slack so that prose is never squeezed
    assert len((REPO / "README.md").read_bytes()) <= 18_000


def _project_graph():
    """{module: the project modules it imports}, every import counted, at the top or inside a function: a circle
    hidden by a function-level import still means two modules that cannot be read, or tested, apart."""
    names = {f"{p.parent.name}.{p.stem}" for p in MODULES if p.parent != REPO} | {p.stem for p in REPO.glob("*.py")}
    graph = {}
    for path in MODULES:
        name = f"{path.parent.name}.{path.stem}" if path.parent != REPO else path.stem
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)  # from grpo.files import x
                found |= {f"{node.module}.{alias.name}" for alias in node.names}  # from grpo import files
        graph[name] = (found & names) - {name}
    return graph


def _cycles(graph):
    """Every import circle in `graph` (as lists of modules, each starting at its smallest name)."""
    cycles, stack = set(), []

    def visit(node):
        if node in stack:
            loop = stack[stack.index(node) :]
            start = loop.index(min(loop))
            cycles.add(tuple(loop[start:] + loop[:start]))
            return
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        stack.pop()

    for node in sorted(graph):
        visit(node)
    return sorted(cycles)


def test_no_import_cycle_among_the_project_modules():
    assert _cycles(_project_graph()) == []


def test_the_cycle_check_sees_a_function_level_circle():
    # the check itself: two modules that import each other, one of them inside a function, are found
    assert _cycles({"grpo.a": {"grpo.b"}, "grpo.b": {"grpo.a"}, "grpo.c": {"grpo.a"}}) == [("grpo.a", "grpo.b")]
    assert _cycles({"grpo.a": {"grpo.b"}, "grpo.b": set()}) == []


def test_errors_is_the_lowest_module():
    # ConfigError lives where every module can import it without importing anything back
    assert _project_graph()["grpo.errors"] == set()


# Libraries whose import costs seconds or memory, which a module may defer into the function that needs them; the
# project's modules that import one at their top count as heavy too (guards, monitor: transformers' callbacks).
# yaml too, though light: a third-party package, and cli.py must import in a bare Python so that process.require can say
# what is missing instead of a ModuleNotFoundError traceback.
HEAVY = {"torch", "transformers", "trl", "peft", "datasets", "accelerate", "vllm", "safetensors", "huggingface_hub"}
HEAVY |= {"tokenizers", "tensorboard", "pyarrow", "tqdm", "numpy", "bitsandbytes", "deepspeed", "kernels", "yaml"}
HEAVY |= {"wandb", "trackio"}  # the optional trackers (requirements-trackers.txt): imported only when in REPORT_TO


def _heavy_project_modules():
    heavy = set()
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
        top += [node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)]
        if {name.partition(".")[0] for name in top} & HEAVY:
            heavy.add(path.stem)
    return heavy


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_function_level_imports_only_defer_a_heavy_library(path):
    heavy_here = _heavy_project_modules()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
                if node.module == "grpo":  # from grpo import guards: heavy when the module is
                    names = [f"grpo.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                project_heavy = name.startswith("grpo.") and name.removeprefix("grpo.") in heavy_here
                assert top in HEAVY or project_heavy, f"{path.name}:{node.lineno} imports {name} inside a function"


# --- the docs name only settings that exist --------------------------------------------------------------------------

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SCRIPT_FILES = [
    "grpotrainer.py",
    "evaluate.py",
    "export.py",
    *sorted(f"bench/{p.name}" for p in (REPO / "bench").glob("*.py")),
]
# what the docs present as a setting: --NAME, NAME=..., a table's first column, a name alone in backticks
SETTING = [r"(?<![\w-])--([A-Z][A-Z0-9_]+)\b", r"(?<![\w./$-])([A-Z][A-Z0-9_]+)=", r"^\|\s*`([A-Z][A-Z0-9_]+)`"]
SETTING += [r"`([A-Z][A-Z0-9_]*_[A-Z0-9_]+|[A-Z]{3,})`"]
# names the docs give for what they are: environment variables of the shell and the libraries, a placeholder in
# "--KEY=value", and a misspelling shown with the message it gets
ENVIRONMENT = {"CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "NCCL_DEBUG", "OMP_NUM_THREADS", "PYTHONPATH", "WORLD_SIZE"}
ENVIRONMENT |= {"VLLM_SERVER_DEV_MODE", "SLURM_GPUS_ON_NODE", "CI", "WANDB_MODE", "WANDB_PROJECT", "TRACKIO_DIR"}
NOT_SETTINGS = ENVIRONMENT | {"KEY", "CONSTANT", "TEMPRATURE"}


def _constants(path):
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    targets = [t for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    return {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()}


def _settings_of_every_kind():
    """Every name a user can set: the scripts' constants, rewards.py's and the demo's, the variables slurm/*.slurm
    reads from the environment (${NAME:-default}) and make's ARGS."""
    names = set().union(*(_constants(path) for path in [*SCRIPT_FILES, "rewards.py", "demo/sums.py", "demo/real.py"]))
    for slurm in (REPO / "slurm").glob("*.slurm"):
        names |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]*):-", slurm.read_text(encoding="utf-8")))
    return names | set(re.findall(r"\$\(([A-Z]+)\)", (REPO / "Makefile").read_text(encoding="utf-8"))) - {"PY"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_setting_the_docs_name_exists_in_the_script_it_belongs_to(doc):
    known = _settings_of_every_kind() | NOT_SETTINGS
    text = doc.read_text(encoding="utf-8")
    named = {m.group(1) for pattern in SETTING for m in re.finditer(pattern, text, re.M)}
    assert not named - known, f"{doc.name} names settings no script has: {sorted(named - known)}"
    # on a line that runs a script, each --NAME is a constant of that script
    for line in text.splitlines():
        ran = [s for s in SCRIPT_FILES if re.search(rf"(?<![\w/]){re.escape(s)}\b", line)]
        flags = set(re.findall(SETTING[0], line)) - NOT_SETTINGS
        if len(ran) == 1 and flags:
            assert not flags - _constants(ran[0]), f"{doc.name}: {line.strip()!r} gives {ran[0]} what it lacks"


def test_the_docs_check_finds_a_setting_that_does_not_exist():
    # the check itself: each way the docs present a setting is seen
    text = "| `NO_SUCH_SETTING` | x |\nset `ALSO_MISSING` or --THIRD_ONE=1 and FOURTH_ONE=2\n"
    named = {m.group(1) for pattern in SETTING for m in re.finditer(pattern, text, re.M)}
    assert named == {"NO_SUCH_SETTING", "ALSO_MISSING", "THIRD_ONE", "FOURTH_ONE"}
