"""The generated README and docs/: every answer recorded, the chosen flavour only, links and
file references that resolve, citations a user can follow."""

from __future__ import annotations

import json
import re

from baked_files import generated_files, text_files
from conftest import TEMPLATE_DIR, answers
from slurm.jobs import PAGE_COMMANDS, page_commands, page_files


def test_answers_doc_states_every_answer(baked):
    name, path = baked
    doc = (path / "docs" / "answers.md").read_text()
    listed = re.findall(r"^\| `(\w+)` \| (.*) \|$", doc, re.MULTILINE)
    asked = [k for k in answers(name) if not k.startswith("_")]
    settings = [
        k
        for k in answers(name)
        if k.startswith("__") and not k.startswith(("__derived_", "__prompts"))
    ]
    assert [key for key, _ in listed] == asked + settings  # every answer and setting, in order
    visible = {k: answers(name)[k] for k in asked + settings}
    uenv = answers(name)["env_flavour"] == "uenv"
    for key, shown in listed:
        value = visible[key]
        unused = " (unused: a uenv repository has no container)"
        assert shown.endswith(unused) == (uenv and key in CONTAINER_ONLY_ANSWERS), key
        shown = shown.removesuffix(unused)
        if "{" not in str(value):  # derived defaults (slug, paths) are rendered in the doc
            assert shown == (str(value) or "(empty)"), key


# Asked of everyone (cookiecutter 2.x has no conditional prompts), used by container repos only.
CONTAINER_ONLY_ANSWERS = ("container_base", "image_dir")


def test_container_answers_say_a_uenv_repo_ignores_them(bake):
    """Their prompts say so, and a uenv repository indeed holds neither value (outside the
    answers record and the linter's generic fixtures)."""
    prompts = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text())["__prompts__"]
    for key in CONTAINER_ONLY_ANSWERS:
        prompt = prompts[key]["__prompt__"] if isinstance(prompts[key], dict) else prompts[key]
        assert prompt.endswith("(container and both only: a uenv repo ignores it)"), key
    repo = bake("uenv-torchrun")
    a = answers("uenv-torchrun")
    for rel, text in text_files(repo).items():
        generic = ("docs/answers.md", "docs/pre-commit.md", "tools/alps_lint.py")
        if rel.startswith("tests/") or rel in generic:
            continue
        assert a["image_dir"] not in text and "alps-extended" not in text, rel
        assert f"{a['__ngc_pytorch_tag']}-py3" not in text, rel


def test_every_citation_is_one_a_user_can_follow(baked):
    """Platform facts cite the CSCS page (https://docs.cscs.ch/...) or the uenv recipe, never the
    template's own notes, which a generated repository does not have."""
    name, path = baked
    for rel in sorted(generated_files(path)):
        text = (path / rel).read_text(errors="replace")
        assert "alps-facts" not in text, f"{name}: {rel} cites alps-facts"


REPO_PATH = re.compile(
    r"(?<![\w/.-])(?:jobs|scripts|container|docs|configs|tools|tests)/[\w.-]+\.(?:sbatch|sh|toml|md|py)\b"
)


CONTAINER_NAMES = re.compile(r"`(Dockerfile|\.dockerignore)`")


def test_no_dangling_references(baked):
    """README, docs and scripts only mention repository files that were generated."""
    name, path = baked
    texts = [
        path / "README.md",
        *path.glob("docs/*.md"),
        *path.glob("scripts/*.sh"),
        *path.glob("jobs/*"),
    ]
    for text_file in texts:
        text = text_file.read_text()
        refs = set(REPO_PATH.findall(text))
        if text_file.name == "README.md":  # the docs may speak of Dockerfiles in general
            refs |= set(CONTAINER_NAMES.findall(text))
        for ref in refs:
            assert (path / ref).exists(), f"{name}: {text_file.name} mentions missing {ref}"


def test_docs_index_links_every_page(baked):
    """docs/index.md links each page of docs/ (answers.md was reachable from nowhere), the README
    links the index, and every link of the index resolves."""
    _, path = baked
    index = (path / "docs" / "index.md").read_text()
    links = set(re.findall(r"\]\(([^)#]+)", index))
    pages = {p.name for p in (path / "docs").glob("*.md")} - {"index.md"}
    assert pages <= links, f"not in docs/index.md: {sorted(pages - links)}"
    assert all((path / "docs" / link).resolve().is_file() for link in links), links
    assert "(docs/index.md)" in (path / "README.md").read_text()


def test_readme_local_section_is_one_path(baked):
    """The README's local set-up is setup_venv.sh --here (dev extras, the venv the demo and the
    E2E tests build) and the dataset goes where docs/training.md puts it."""
    name, path = baked
    readme = (path / "README.md").read_text()
    local = readme.split("## Run it locally", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"scripts/setup_venv\.sh \w+ --here && \. \.venv-\w+/bin/activate", local)
    assert local.count("pip install") == 1  # torch itself, where python3 has none
    assert "python -m venv" not in local
    if answers(name)["workload"] == "program":  # no dataset, no training package
        assert "doctor --device cpu" in local and "python -m pytest" in local
        return
    if answers(name)["workload"] == "program":  # no dataset, no training package
        assert "doctor --device cpu" in local and "python -m pytest" in local
        return
    if answers(name)["workload"] == "images":  # synthetic images: no dataset to make first
        assert "--config configs/tiny.toml run_dir=runs/local " in local
        assert "make-dataset" not in local and "fast subset" in local and "full suite" in local
        return
    training = (path / "docs" / "training.md").read_text()
    assert "--out data/stdlib-bytes" in local and "--out data/stdlib-bytes" in training
    assert "runs/stdlib-bytes" not in readme
    assert "fast subset" in local and "full suite" in local


def test_readme_says_where_to_clone_and_how_to_try_the_debug_partition(baked):
    name, path = baked
    readme = (path / "README.md").read_text()
    assert "**Where to clone**: in `$HOME`" in readme and "/capstor/store" in readme
    assert "14 days" in readme
    debug_run = (
        "sbatch --nodes=1" if answers(name)["partition"] == "debug" else "sbatch --partition=debug"
    )
    assert debug_run in readme
    limits = {"clariden": "at most 4 nodes and 1.5 node-hours", "daint": "at most 2 nodes and 30"}
    limits["santis"] = limits["daint"]
    assert limits[answers(name)["cluster"]] in readme


def test_readme_speaks_of_the_chosen_flavour_only(baked):
    """The flavour sections are included per flavour (templates/readme_*.md.j2): a one-flavour
    README says nothing of the other environment."""
    name, path = baked
    readme = (path / "README.md").read_text()
    flavour = answers(name)["env_flavour"]
    assert ("uenv" in readme.lower()) == (flavour != "container")
    assert ("Container Engine" in readme) == (flavour != "uenv")
    assert ("Dockerfile" in readme) == (flavour != "uenv")


def test_every_command_of_the_your_program_page_is_run_by_a_test(baked):
    """docs/your-program.md: each command line is one that a test runs as typed (PAGE_COMMANDS
    says which test), and its files are the ones the Slurm tests save from it."""
    _, path = baked
    commands = page_commands(path)
    for line in commands:
        runs = [word for word in PAGE_COMMANDS if word in line]
        assert len(runs) == 1, f"no test runs, as typed, this line of the page: {line}"
    for word in PAGE_COMMANDS:
        assert len([line for line in commands if word in line]) == 1, word
    files = page_files(path)
    assert set(files) == {"hello_ddp.py", "train_images.py", "cu_emt.py", "options.yaml"}
    for name, text in files.items():
        if name.endswith(".py"):
            compile(text, name, "exec")  # the page's Python is whole
