"""Where code lives and how settings travel: four files at the root, the helpers in grpo/, the CPU profiles in demo/,
scripts that share the package and never import each other or write its globals, a training script that reads in
one sitting and whose constants few other files name, and docs that fit a sitting and say each fact once.

.venv/bin/python -m pytest tests/test_structure.py -q
"""

import ast
import functools
import re

import pytest
from conftest import REPO

ROOT_FILES = {"grpotrainer.py", "rewards.py", "evaluate.py", "export.py"}  # what a user runs or edits
SCRIPTS = {"grpotrainer", "evaluate", "export"}
PACKAGE = REPO / "grpo"
# the helpers, one module per seam (a new one is added here on purpose)
PACKAGE_MODULES = {"advice", "callbacks", "checkpoints", "cli", "errors", "evaluation", "files", "generation"}
PACKAGE_MODULES |= {"grading", "gsm8k", "hardware", "hub", "modelcard", "patches", "plan", "preflight", "process"}
PACKAGE_MODULES |= {"recipes", "reward_guard", "settings", "stats", "weight_sync"}
TRAINER_ONLY = {
    "callbacks",
    "patches",
}  # TrainerCallback subclasses and GRPOTrainer's patches: transformers at the top
DEMO = REPO / "demo"  # the CPU profiles (--smoke, --demo, --real): their tasks and models, not helpers of training
PROFILES = {"smoke", "sums", "real"}
MODULES = sorted([*REPO.glob("*.py"), *PACKAGE.glob("*.py"), *DEMO.glob("*.py")])


@functools.cache
def _text(path):
    return path.read_text(encoding="utf-8")


@functools.cache
def _tree(path):
    """A file's syntax tree, parsed once for all the checks of a session."""
    return ast.parse(_text(path))


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node, [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            yield node, [node.module or ""]


def test_the_root_holds_only_what_a_user_runs_or_edits_and_the_package_its_helpers():
    assert {p.name for p in REPO.glob("*.py")} == ROOT_FILES
    assert {p.stem for p in PACKAGE.glob("*.py")} == PACKAGE_MODULES | {"__init__"}
    assert {p.stem for p in DEMO.glob("*.py")} == PROFILES | {"__init__"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_imports_a_script_or_writes_globals(path):
    tree = _tree(path)
    in_package = path.parent == PACKAGE
    for node, names in _imports(tree):
        assert not set(names) & (SCRIPTS - {path.stem}), f"{path.name}:{node.lineno} imports a script"
        # the package serves the scripts, rewards.py and the profiles; it never reaches back into them
        reaches_back = {name for name in names if name == "rewards" or name.partition(".")[0] == "demo"}
        assert not (in_package and reaches_back), f"{path.name}:{node.lineno} imports {reaches_back}"
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Global), f"{path.name}:{node.lineno} uses `global`"
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            target = node.args[0]
            assert not (isinstance(target, ast.Name) and target.id in SCRIPTS), f"{path.name}:{node.lineno}"


@pytest.mark.parametrize("name", sorted(PACKAGE_MODULES - TRAINER_ONLY))
def test_shared_modules_import_no_heavy_library_at_the_top(name):
    # most modules serve several scripts; one caller's callback must not make them all import transformers, neither
    # directly nor through a project module that does
    tree = _tree(PACKAGE / f"{name}.py")
    top = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
    top += [node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)]
    top += [f"grpo.{a.name}" for node in tree.body if isinstance(node, ast.ImportFrom) for a in node.names]
    heavy = {"torch", "transformers", "trl", "peft", "datasets", "accelerate", "vllm"}
    assert not {name.partition(".")[0] for name in top} & heavy
    assert not set(top) & {f"grpo.{module}" for module in TRAINER_ONLY}


TRAINING_SCRIPT = REPO / "grpotrainer.py"


def test_the_training_script_reads_in_one_sitting():
    # about 300 lines written plainly (STYLE.md): one assignment per line, keywords where a call passes more than
    # three values, main() in about thirty lines. What the bounds catch is a script that has stopped reading in
    # one sitting; none may be met by packing code
    text = TRAINING_SCRIPT.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
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


def test_the_training_scripts_lines_are_mostly_under_100_characters():
    lines = TRAINING_SCRIPT.read_text(encoding="utf-8").splitlines()
    assert sum(len(line) > 100 for line in lines) <= len(lines) / 10  # STYLE.md: lines mostly under 100 characters


def _block_constants(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    rulers = [i for i, line in enumerate(lines) if line.startswith("# ----")][:2]
    return [m[1] for line in lines[rulers[0] + 1 : rulers[1]] if (m := re.match(r"([A-Z][A-Z0-9_]*) = ", line))]


def _naming_files(constant, paths):
    return sum(bool(re.search(rf"\b{constant}\b", _text(path))) for path in paths)


def test_the_naming_count_counts_whole_words(tmp_path):
    # the check itself: BF16 is named by `s["BF16"]`, not by USE_BF16 or bf16
    (tmp_path / "a.py").write_text('x = s["BF16"]\n')
    (tmp_path / "b.py").write_text("USE_BF16 = bf16 = 1\n")
    assert _naming_files("BF16", [tmp_path / "a.py", tmp_path / "b.py"]) == 1


def test_the_training_scripts_constants_are_named_in_few_other_files():
    # a setting is read where main() maps it (STYLE.md: grep for a constant finds every use); a constant that many
    # files name by hand is a setting whose meaning is spread around instead of passed as a value
    constants = _block_constants(TRAINING_SCRIPT)
    others = [p for p in [*REPO.glob("*.py"), *PACKAGE.glob("*.py")] if p != TRAINING_SCRIPT]
    counts = {constant: _naming_files(constant, others) for constant in constants}
    assert len(constants) >= 50  # the constants block was found
    assert sum(counts.values()) / len(counts) <= 3.0, sorted(counts.items(), key=lambda item: -item[1])[:10]


def _project_graph():
    """{module: the project modules it imports}, every import counted, at the top or inside a function: a circle
    hidden by a function-level import still means two modules that cannot be read, or tested, apart."""
    names = {f"{p.parent.name}.{p.stem}" for p in MODULES if p.parent != REPO} | {p.stem for p in REPO.glob("*.py")}
    graph = {}
    for path in MODULES:
        name = f"{path.parent.name}.{path.stem}" if path.parent != REPO else path.stem
        found = set()
        for node in ast.walk(_tree(path)):
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
# project's modules that import one at their top count as heavy too (callbacks, patches: transformers' callbacks).
# yaml and filelock too, though light: third-party packages, and cli.py (recipes) and process.py must import in a
# bare Python so that process.require can say what is missing instead of a ModuleNotFoundError traceback.
HEAVY = {"torch", "transformers", "trl", "peft", "datasets", "accelerate", "vllm", "safetensors", "huggingface_hub"}
HEAVY |= {"tokenizers", "tensorboard", "pyarrow", "tqdm", "numpy", "bitsandbytes", "deepspeed", "kernels", "yaml"}
# third-party: in a Python without the requirements only the function that needs one fails
HEAVY |= {"filelock", "jinja2", "markdown"}
HEAVY |= {"wandb", "trackio"}  # the optional trackers (requirements-trackers.txt): imported only when in REPORT_TO


@functools.cache
def _heavy_project_modules():
    heavy = set()
    for path in PACKAGE.glob("*.py"):
        tree = _tree(path)
        top = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
        top += [node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)]
        if {name.partition(".")[0] for name in top} & HEAVY:
            heavy.add(path.stem)
    return heavy


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_function_level_imports_only_defer_a_heavy_library(path):
    heavy_here = _heavy_project_modules()
    tree = _tree(path)
    for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
                if node.module == "grpo":  # from grpo import callbacks: heavy when the module is
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


@functools.cache
def _constants(path):
    tree = _tree(REPO / path)
    targets = [t for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    return {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()}


@functools.cache
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


# --- the docs fit a sitting and say each fact once -------------------------------------------------------------------

MARKDOWN = sorted(
    p
    for p in REPO.rglob("*.md")
    if not any(part.startswith(".") or part in ("outputs", "node_modules") for part in p.relative_to(REPO).parts)
)
RULER_OR_FENCE = re.compile(r"\|?[\s:|-]*-[\s:|-]*\|?|```.*")  # a table's |---|---| line, a code fence


def test_the_readme_fits_a_sitting():
    # about 200 lines, under 16 KB (STYLE.md): what it is, the two commands, the smoke run, the first constants
    assert len((REPO / "README.md").read_bytes()) <= 16_384


@pytest.mark.parametrize("page", sorted((REPO / "docs").glob("*.md")), ids=lambda p: p.name)
def test_each_users_guide_fits_a_sitting(page):
    # docs/ holds users' guides, 16 KB at most like the README; measurement notes go beside the bench scripts
    assert len(page.read_bytes()) <= 16_384


def test_the_real_model_page_fits_a_sitting():
    # a recipe page under docs/: what it shows and how to rerun it; its figures belong in bench/README.md
    assert len((REPO / "docs" / "real-model.md").read_bytes()) <= 12_288


def _duplicated_lines(text):
    seen, twice = set(), []
    for line in (line.strip() for line in text.splitlines()):
        if re.search(r"\w", line) and not RULER_OR_FENCE.fullmatch(line):  # a line of punctuation says nothing
            (twice.append if line in seen else seen.add)(line)
    return twice


@pytest.mark.parametrize("doc", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_no_markdown_file_says_a_line_twice(doc):
    # each fact in one place (STYLE.md): a line said twice is a fact kept in two places, which drift apart
    assert _duplicated_lines(doc.read_text(encoding="utf-8")) == []


def test_the_duplicate_check_skips_rulers_fences_and_blank_lines():
    # the check itself: the repeated sentence is found; table rulers, fences and blank lines are not
    text = "| a |\n|---|\n\n```bash\nx\n```\n\n| b |\n| :--- |\nSay it once.\nSay it once.\n"
    assert _duplicated_lines(text) == ["Say it once."]
    assert len(MARKDOWN) >= 8  # README, bench/README and docs/: the glob found them


# a module the docs or the code name, by path (grpo/x.py) or by import name (grpo.x)
MODULE_NAME = re.compile(r"(?<![\w-])grpo[/.]([a-z_0-9]+)")  # not a folder like qwen3-gsm8k-grpo/
NAMING = [*MARKDOWN, *MODULES, *sorted((REPO / "bench").glob("*.py")), REPO / "Makefile"]


def test_every_module_the_docs_and_code_name_exists():
    named = {
        f"{path.relative_to(REPO)}: grpo.{m[1]}"
        for path in NAMING
        for m in MODULE_NAME.finditer(path.read_text(encoding="utf-8"))
        if m[1] not in PACKAGE_MODULES
    }
    assert sorted(named) == []
