"""The package's layout: its module map (docs/training.md) lists every module and only those,
imports run down the layers that docs/training.md lists (also imports inside functions or under
TYPE_CHECKING), so no two folders import each other, no module imports another in a cycle, a run
never imports a dataset writer and no kind of dataset imports another; a small root, short
modules, and no folder holding more than a fifth of the package."""

from __future__ import annotations

import ast
{%- if cookiecutter.workload != "program" %}
import io
import keyword
import re
import tokenize
{%- endif %}
from pathlib import Path

from conftest import PACKAGE, REPO
{%- if cookiecutter.workload != "program" %}

from {{ cookiecutter.package_name }}.commands import COMMANDS
from {{ cookiecutter.package_name }}.config import settings
from {{ cookiecutter.package_name }}.data.kinds import KIND_MODULES
from {{ cookiecutter.package_name }}.make_dataset.sources import SOURCE_MODULES
from {{ cookiecutter.package_name }}.models import MODEL_MODULES
{%- endif %}

SRC = REPO / "src" / PACKAGE
TRAINING_MD = REPO / "docs" / "training.md"
MAX_ROOT_MODULES = 8
MAX_LINES = 450
MAX_FOLDER_SHARE = 0.20  # of the package's lines
# folders whose __init__.py is a docstring only
FOLDERS_IMPORTING_NOTHING = ("config", "data", "run", "telemetry", "doctor", "training")
FOLDERS_IMPORTING_NOTHING += ("make_dataset",)


def module_name(path: Path) -> str:
    """src/<pkg>/data/tokens.py -> "data.tokens"; a folder's __init__.py -> the folder's name."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `path` imports, wherever the import statement is."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and node.module.split(".")[0] == PACKAGE:
                target = node.module.partition(".")[2]
            else:
                continue
            for alias in node.names:  # `from . import tokens` imports the module data.tokens
                sub = f"{target}.{alias.name}" if target else alias.name
                found.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    found.add(alias.name.partition(".")[2])
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# The modules every bake has (the package of the `program` workload): the command line, the
# doctor, and the launcher of your own program with the run directory's lock, preemption and
# requeue. The `all` workload adds the training package (docs/training.md's module map).
WORKLOAD = "{{ cookiecutter.workload }}"
PROGRAM_MODULES = {
    *("", "__main__", "cli", "commands", "commands.doctor", "config_keys", "distributed"),
    *("doctor", "doctor.bandwidth", "doctor.checks", "doctor.nodes", "doctor.preflight"),
    *("doctor.storage", "doctor.vision"),
    *("run", "run.atomic", "run.interrupts", "run.lock", "run.preemption", "run.program"),
    *("run.rundir", "run.torchrun"),
}


def test_the_bake_has_its_workloads_modules():
    found = set(modules())
    assert PROGRAM_MODULES <= found, f"missing: {sorted(PROGRAM_MODULES - found)}"
    if WORKLOAD == "program":
        assert found == PROGRAM_MODULES, f"not the program's: {sorted(found - PROGRAM_MODULES)}"


def test_the_modules_every_bake_has_import_only_each_other():
    """Also inside functions: the `program` bake, which has only these, must import."""
    graph = import_graph()
    outside = {(a, b) for a in PROGRAM_MODULES for b in graph[a] if b not in PROGRAM_MODULES}
    assert not outside, sorted(outside)
{%- if cookiecutter.workload != "program" %}


def documented_layers() -> list[set[str]]:
    """docs/training.md's numbered list of layers, lowest first: each item's `names` (a folder
    written `run/`, a module at the package's root `cli`)."""
    text = TRAINING_MD.read_text()
    section = text[text.index("Imports run one way, down these layers") :]
    items = re.findall(r"^\d+\. (.+)$", section.split("\n\n", 2)[1], re.MULTILINE)
    return [{name.rstrip("/") for name in re.findall(r"`([\w/]+)`", item)} for item in items]


def upward_imports(graph: dict[str, set[str]], layers: list[set[str]]) -> set[tuple[str, str]]:
    """The imports (module, imported) that go to a higher layer. A module's layer is that of its
    folder, or its own for a module at the package's root."""
    level = {name: i for i, names in enumerate(layers) for name in names}

    def layer(module: str) -> int:
        return level[module.split(".")[0]]

    return {(a, b) for a, targets in graph.items() if a for b in targets if layer(b) > layer(a)}


def test_imports_run_down_the_layers():
    layers = documented_layers()
    listed = set().union(*layers)
    graph = import_graph()
    unlisted = {name.split(".")[0] for name in graph if name} - listed
    assert not unlisted, f"not in docs/training.md's list of layers: {sorted(unlisted)}"
    upward = upward_imports(graph, layers)
    assert not upward, "imports that run up the layers of docs/training.md: " + ", ".join(
        f"{a} -> {b}" for a, b in sorted(upward)
    )


def test_an_import_up_the_layers_is_found():
    layers = [{"config_keys"}, {"run"}, {"models"}, {"checkpoint"}, {"cli"}]
    graph = {"models.gpt": {"run.atomic", "config_keys"}, "run.atomic": set(), "cli": {"models"}}
    assert upward_imports(graph, layers) == set()
    graph["models.hf"] = {"checkpoint.hf_format"}  # what the adapters did before issue 39
    assert upward_imports(graph, layers) == {("models.hf", "checkpoint.hf_format")}


def test_a_reader_or_the_loop_importing_a_dataset_writer_runs_up_the_layers():
    """Reading and writing datasets are floors apart: `data/` (and the training loop above it)
    importing make_dataset/ is refused by the documented layers, so a run never loads a writer."""
    layers = documented_layers()
    graph = import_graph()
    graph["data.arrays"] = graph["data.arrays"] | {"make_dataset.arrays"}
    graph["training.loop"] = graph["training.loop"] | {"make_dataset.sources"}
    assert upward_imports(graph, layers) == {
        ("data.arrays", "make_dataset.arrays"),
        ("training.loop", "make_dataset.sources"),
    }


def kind_imports(graph: dict[str, set[str]], names=KIND_MODULES) -> set[tuple[str, str]]:
    """(kind, kind) pairs where a dataset kind's module imports another kind's."""
    kinds = {f"data.{name}" for name in names}
    return {(a, b) for a in kinds for b in graph.get(a, set()) & kinds}


def test_no_kind_of_dataset_imports_another():
    """What the kinds share (the error class, hashes, the positional reader, index.json) is
    data/directory.py, written once."""
    graph = import_graph()
    assert kind_imports(graph) == set()
    before = {"data.chat": {"data.tokens", "data.directory"}, "data.tokens": set()}  # issue 49
    assert kind_imports(before, ("chat", "tokens")) == {("data.chat", "data.tokens")}


# The workloads (issue 56): the modules each brings. Every module not listed here is shared: it
# imports no workload's module, not even inside a function (a model, a dataset kind, an export
# format or an adapter reaches shared code through a registry: models/__init__.py, data/kinds.py,
# make_dataset/sources.py, the commands table, ...), and no workload imports another's. A bake of
# one workload keeps the shared modules and its own.
WORKLOADS = {
    "language": (
        "models.gpt", "models.gpt_hf", "models.hf", "models.lora",
        "data.tokens", "data.windows", "data.chat", "data.tokenizer",
        "data.recorded_tokenizer",
        "checkpoint.hf_format", "checkpoint.initial_hf", "checkpoint.lora",
        "checkpoint.export_hf", "checkpoint.export_peft",
        "make_dataset.tokens", "make_dataset.text_files", "make_dataset.hf_datasets",
        "make_dataset.chat", "make_dataset.chat_template", "make_dataset.chat_worker",
        "make_dataset.tokenizer", "make_dataset.benchmark",
        "commands.generate", "commands.train_tokenizer",
    ),
    "images": (
        "models.vision", "models.timm",
        "data.images", "data.augmentation", "data.preprocessing",
        "make_dataset.images", "make_dataset.image_check",
    ),
}  # fmt: skip
# Imports across a workload's walls that are not yet inverted: (module, imported): why.
# (none now; a crossing listed here fails the test once it is gone)
KNOWN_CROSSINGS: dict[tuple[str, str], str] = {}


def workload_of(module: str) -> str | None:
    return next((w for w, names in WORKLOADS.items() if module in names), None)


def crossings(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, imported) where a shared module imports a workload's, or a workload another's."""
    return {
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if workload_of(b) is not None and workload_of(a) != workload_of(b)
    }


def test_shared_code_knows_no_workload():
    found = crossings(import_graph())
    new = sorted(found - KNOWN_CROSSINGS.keys())
    listed = ", ".join(f"{a} -> {b}" for a, b in new)
    assert not new, f"imports across a workload's walls: {listed}"
    gone = sorted(KNOWN_CROSSINGS.keys() - found)
    assert not gone, f"KNOWN_CROSSINGS lists imports that are gone (remove them): {gone}"


# The workloads this bake keeps (the `workload` answer; `all`: every one)
KEPT = {"all": tuple(WORKLOADS), "program": ()}.get(WORKLOAD, (WORKLOAD,))


def test_the_bake_has_its_workloads_modules_and_no_others():
    known = set(modules())
    listed = [m for names in WORKLOADS.values() for m in names]
    assert len(listed) == len(set(listed)), "a module in two workloads"
    kept = {m for w in KEPT for m in WORKLOADS[w]}
    assert not kept - known, f"missing: {sorted(kept - known)}"
    others = (set(listed) - kept) & known
    assert not others, f"modules of a workload this bake does not keep: {sorted(others)}"


# Shared modules that still compare a dataset kind's name: module: why.
KNOWN_KIND_BRANCHES: dict[str, str] = {}


def kind_name_branches(source: str, names: set[str]) -> list[str]:
    """The comparisons in `source` with a dataset kind's name: `kind.name != "tokens"`,
    `info.kind in ("tokens", "chat")`."""

    def named(node: ast.expr) -> bool:
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(named(e) for e in node.elts)
        return isinstance(node, ast.Constant) and node.value in names

    return [
        ast.unparse(node)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Compare) and any(map(named, [node.left, *node.comparators]))
    ]


def test_shared_code_branches_on_no_kind_of_data():
    """A shared module asks the kind (data/info.py's DatasetKind) what it needs instead."""
    names = set(KIND_MODULES) | {"tokens", "images"}  # the probe's names too
    found = {
        name: branches
        for name, path in modules().items()
        if workload_of(name) is None and (branches := kind_name_branches(path.read_text(), names))
    }
    assert found.keys() == KNOWN_KIND_BRANCHES.keys(), found
    before = 'if run.source.info.kind == "tokens":\n    pass\nx = kind in ("images",)\n'
    assert kind_name_branches(before, names) == [
        "run.source.info.kind == 'tokens'",
        "kind in ('images',)",
    ]
    assert kind_name_branches('unit = "tokens"\n', names) == []


def workload_keys() -> dict[str, str]:
    """The config keys that a workload's module declares (a model's section, a dataset kind's
    `keys`, or a section they build on), by name: the module that declares each."""
    sections = [*settings.MODEL_SECTIONS.values(), *settings.KIND_SECTIONS]
    found = {}
    for section in {base for s in sections for base in s.__mro__ if base is not object}:
        module = section.__module__.partition(".")[2]
        if workload_of(module):
            found |= {name: module for name in section.__dataclass_fields__}
    return found


def keys_read(source: str, names) -> list[str]:
    """The keys of `names` that the code of `source` reads from a Config: `cfg.vocab_size`,
    `run.cfg.vocab_size` (not its docstrings and comments)."""
    return sorted(
        {
            node.attr
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute)
            and node.attr in names
            and re.search(r"\bcfg$", ast.unparse(node.value))
        }
    )


def test_shared_code_reads_no_workloads_key():
    """A key only a workload reads is declared by the workload's module (a bake without it
    then neither lists nor documents it); shared code reads it nowhere and declares none (a
    general key's section is a shared module's), even behind a check of the kind it has."""
    homes = {s.__module__.partition(".")[2] for s in settings.SECTIONS}
    assert not [home for home in homes if workload_of(home)], homes
    owned = workload_keys()
    found = {
        name: used
        for name, path in modules().items()
        if workload_of(name) is None and (used := keys_read(path.read_text(), owned))
    }
    assert not found, found
    before = '"""`cfg.lr`"""\nif not cfg.init_new_vocabulary:\n    x = cfg.vocab_sizes + cfg.lr\n'
    assert keys_read(before, ["init_new_vocabulary", "vocab_size", "lr"]) == [
        "init_new_vocabulary",
        "lr",
    ]
    assert keys_read("x = run.cfg.vocab_size + mycfg.lr\n", ["vocab_size", "lr"]) == ["vocab_size"]


# The generated tests by workload: a bake keeps the files of its workloads. "program": every
# bake's (the command line, the doctor, the run directory); "shared": every training bake's, run
# on conftest.py's TINY (the classifier, models/mlp.py). A test file you add is one name here.
TEST_FILES = {
    "program": """conftest _faults test_alps_lint test_distributed test_doctor test_doctor_nodes
        test_layout test_program test_rundir_lock""",
    "shared": """_ckpt_driver test_checkpoint test_checkpoint_dcp test_cli test_cli_style
        test_compare test_config test_config_files test_console test_data test_error_boundary
        test_evaluate test_hostile_data test_init_from test_non_finite test_preemption
        test_prefetch test_profiling test_resume test_run_integrity test_rundir
        test_second_signal test_tracking test_train _plan test_plan _layouts""",
    "language": """_language test_benchmark_tokens test_chat test_chat_template
        test_config_files_gpt test_evaluate_tokens test_generate test_gpt test_hf_data
        test_hf_export test_hf_gpt2 test_hf_model test_hf_sources test_hostile_tokens
        test_language_runs test_lora test_tokens test_plan_language""",
    "images": """test_augmentation test_benchmark_images test_hostile_images test_image_formats
        test_images test_timm test_vision test_vision_resume""",
}
TEST_WORKLOADS = {name: w for w, names in TEST_FILES.items() for name in names.split()}
TESTS = REPO / "tests"
# What only a workload has, as a shared test would name it: its models and make-dataset's inputs
WORKLOAD_MODELS = re.compile(r"\bmodel=(gpt|hf|vision|timm)\b")
WORKLOAD_INPUTS = {"--stdlib", "--text", "--tokens", "--hf", "--chat", "--images"}
# an import written inside a string (a program a test runs with python -c)
IMPORT_IN_TEXT = re.compile(r"(?:from|import) (?:\{PACKAGE\}|\w+)\.([\w.]+)(?: import ([\w, ]+))?")


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstrings' nodes: a docstring may name a workload's model."""
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def workload_uses(source: str, package: str, names_models: bool = True) -> list[str]:
    """What `source` (a test file) uses of the language and images workloads: imports of their
    modules (also inside functions and in programs written as strings) or of their test files,
    and, with `names_models`, their models (model=gpt, Config(model="gpt")) and make-dataset's
    inputs (--text)."""
    known = set(modules()) | {m for names in WORKLOADS.values() for m in names}

    def imported(target: str, names: list[str]) -> set[str]:
        subs = {f"{target}.{name}" if target else name for name in names}
        return {sub if sub in known else target for sub in subs}

    tree = ast.parse(source)
    found, skip = [], docstrings(tree)
    for node in ast.walk(tree):  # an f-string is read as one text, `{PACKAGE}` as written
        if isinstance(node, ast.JoinedStr):
            skip |= {id(part) for part in node.values}
            text = "".join(p.value if isinstance(p, ast.Constant) else "{X}" for p in node.values)
            node.values = [ast.Constant(text.replace("{X}", "{PACKAGE}"))]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            top, _, rest = node.module.partition(".")
            if top == package:
                names = [alias.name for alias in node.names]
                found += [f"imports {m}" for m in imported(rest, names) if workload_of(m)]
            elif TEST_WORKLOADS.get(node.module) in WORKLOADS:
                found.append(f"imports {node.module}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                top, _, rest = alias.name.partition(".")
                if top == package and workload_of(rest):
                    found.append(f"imports {rest}")
                elif TEST_WORKLOADS.get(alias.name) in WORKLOADS:
                    found.append(f"imports {alias.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in skip:
                continue
            for target, names in IMPORT_IN_TEXT.findall(node.value):
                parts = [n.strip() for n in names.split(",")] if names else []
                found += [f"imports {m}" for m in imported(target, parts) if workload_of(m)]
            if names_models:
                found += [f"names {m.group()}" for m in WORKLOAD_MODELS.finditer(node.value)]
                found += [f"names {node.value}"] if node.value in WORKLOAD_INPUTS else []
        elif isinstance(node, ast.keyword) and node.arg == "model" and names_models:
            value = node.value
            if isinstance(value, ast.Constant) and WORKLOAD_MODELS.search(f"model={value.value}"):
                found.append(f"names model={value.value}")
    return found


def test_every_test_file_has_one_workload():
    files = {p.stem for p in TESTS.glob("*.py") if p.stem.startswith(("test_", "_", "conftest"))}
    listed = [name for names in TEST_FILES.values() for name in names.split()]
    assert len(listed) == len(TEST_WORKLOADS), "a file listed twice in TEST_FILES"
    unlisted = sorted(files - TEST_WORKLOADS.keys())
    assert not unlisted, f"not in TEST_WORKLOADS (add each with its workload): {unlisted}"
    if WORKLOAD == "all":
        assert files == TEST_WORKLOADS.keys(), sorted(TEST_WORKLOADS.keys() - files)


def names_models(name: str) -> bool:
    """Whether the check of test file `name` includes the workloads' models: for the shared
    files and conftest.py's helpers (the doctor's tests name the models that need torchvision)."""
    return TEST_WORKLOADS[name] == "shared" or name == "conftest"


def test_the_shared_tests_use_no_workload():
    """A shared test file (and every bake's) runs in a bake with neither workload: it imports no
    workload's module or test file and trains none of their models nor makes their datasets."""
    found = {
        name: uses
        for name, workload in TEST_WORKLOADS.items()
        if workload in ("program", "shared")
        and name != "test_layout"  # its probes name the workloads on purpose
        and (TESTS / f"{name}.py").exists()
        and (uses := workload_uses((TESTS / f"{name}.py").read_text(), PACKAGE, names_models(name)))
    }
    assert not found, found


def test_a_shared_test_using_a_workload_is_found():
    broken = f"""
\"\"\"Trains model=gpt in its docstring only: no use.\"\"\"
import {PACKAGE}.models.vision
from {PACKAGE}.models import gpt, spec_of
from {PACKAGE}.data.tokens import TokenDataset
from test_chat import conversations
from conftest import TINY
def test_x(cli):
    \"\"\"model=hf here too.\"\"\"
    cli("train", "model=timm", "dataset=x", "--text", "a.txt")
    Config(model="hf")
    Config(model="mlp")
"""
    broken += 'PROGRAM = f"from {' + 'PACKAGE}.make_dataset import tokens, arrays"\n'  # python -c
    assert sorted(workload_uses(broken, PACKAGE)) == [
        "imports data.tokens",
        "imports make_dataset.tokens",
        "imports models.gpt",
        "imports models.vision",
        "imports test_chat",
        "names --text",
        "names model=hf",
        "names model=timm",
    ]
    assert workload_uses(broken, PACKAGE, names_models=False) == [
        u for u in workload_uses(broken, PACKAGE) if u.startswith("imports")
    ]
    clean = f"from {PACKAGE}.models import spec_of\nfrom conftest import TINY\nx = 'model=mlp'\n"
    assert workload_uses(clean, PACKAGE) == []


def test_an_import_across_a_workload_is_found():
    graph = {"checkpoint.start": {"models.lora", "config_keys"}, "models.lora": set()}
    assert crossings(graph) == {("checkpoint.start", "models.lora")}  # before issue 56
    graph = {"make_dataset.images": {"make_dataset.hf_datasets", "data.directory"}}
    assert crossings(graph) == {("make_dataset.images", "make_dataset.hf_datasets")}
    assert crossings({"models.timm": {"models.vision"}, "models.hf": {"models.lora"}}) == set()


def test_the_module_map_is_the_tree():
    text = (REPO / "docs" / "training.md").read_text()
    mapped = set()
    for row in re.findall(r"^\| (`[^|]+) \|", text, re.MULTILINE):
        mapped |= set(re.findall(r"`([\w/]+\.py)`", row))
    tree = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")}
    tree -= {f"{d}/__init__.py" for d in FOLDERS_IMPORTING_NOTHING}
    tree -= {"__init__.py"}
    # a model, a dataset kind, an input format or a command you add is one file and one
    # registry line (docs/your-model.md, docs/your-data.md, docs/data.md, docs/training.md),
    # not a map line too
    tree -= {f"models/{name}.py" for name in MODEL_MODULES} - mapped
    tree -= {f"data/{name}.py" for name in KIND_MODULES} - mapped
    tree -= {f"make_dataset/{name}.py" for name in SOURCE_MODULES} - mapped
    tree -= {f"commands/{c.name.replace('-', '_')}.py" for c in COMMANDS.values()} - mapped
    assert mapped == tree, (
        f"in docs/training.md's module map but not in the package: {sorted(mapped - tree)}; "
        f"in the package but not in the map: {sorted(tree - mapped)}"
    )


def test_small_modules_and_a_small_top_level():
    top = sorted(p.name for p in SRC.glob("*.py"))
    assert len(top) <= MAX_ROOT_MODULES, top
    long = {
        p.relative_to(SRC).as_posix(): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_folder_holds_more_than_a_fifth_of_the_package():
    lines = {p: len(p.read_text().splitlines()) for p in SRC.rglob("*.py")}
    total = sum(lines.values())
    folders = {p.relative_to(SRC).parts[0] for p in lines if len(p.relative_to(SRC).parts) > 1}
    share = {
        folder: sum(n for p, n in lines.items() if p.relative_to(SRC).parts[0] == folder) / total
        for folder in folders
    }
    assert max(share.values()) <= MAX_FOLDER_SHARE, {f: round(v, 3) for f, v in share.items()}


def test_the_folders_import_nothing_when_imported():
    for folder in FOLDERS_IMPORTING_NOTHING:
        tree = ast.parse((SRC / folder / "__init__.py").read_text())
        assert all(isinstance(n, ast.Expr) for n in tree.body), folder  # a docstring only


def minus_100(source: str) -> list[int]:
    """The lines where `source` writes the number -100 (a unary minus: not `a - 100`; comments
    and strings are not code)."""
    found, before = [], [None, None]  # the two significant tokens before this one
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT):
            continue
        operand = before[0] is not None and (
            before[0].type in (tokenize.NUMBER, tokenize.STRING)
            or (before[0].type == tokenize.NAME and not keyword.iskeyword(before[0].string))
            or before[0].string in (")", "]", "}")
        )
        if token.string == "100" and before[1] is not None and before[1].string == "-":
            if not operand:
                found.append(token.start[0])
        before = [before[1], token]
    return found


def test_one_constant_names_the_targets_no_loss_reads():
    """Cross entropy's ignore_index is written once: data/info.py's IGNORE_INDEX, which the
    windows, the chat windows and the loss import."""
    found = {
        p.relative_to(SRC).as_posix(): lines
        for p in SRC.rglob("*.py")
        if (lines := minus_100(p.read_text()))
    }
    assert list(found) == ["data/info.py"] and len(found["data/info.py"]) == 1, found
    probe = "IGNORE = -100  # -100\nx = '-100'\ny = a - 100\nz = f(-100)\nreturn -100\n"
    assert minus_100(probe) == [1, 4, 5]


def batch_form_checks(source: str) -> list[str]:
    """`isinstance(...)` calls on a batch (or on what a task's loss returned) in `source`."""
    return [
        ast.unparse(node)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "isinstance"
        and node.args
        and re.search(r"\b(batch|loss)\b", ast.unparse(node.args[0]))
    ]


def test_no_model_tells_a_batch_by_its_form():
    """A language model's batches have one form (data/info.py's token_batch), and a task's loss
    one type: models/ never asks which form it got."""
    checks = {
        p.relative_to(SRC).as_posix(): found
        for p in (SRC / "models").rglob("*.py")
        if (found := batch_form_checks(p.read_text()))
    }
    assert not checks, checks
    before = "def loss(model, batch):\n    if isinstance(batch, dict):\n        return 0\n"
    assert batch_form_checks(before) == ["isinstance(batch, dict)"]
{%- endif %}
