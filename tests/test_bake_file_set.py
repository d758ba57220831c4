"""Every named configuration bakes into exactly the files it should, each fact in one of them,
all of them rendered and valid; regenerating adds nothing."""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
import tomllib
from pathlib import Path

from baked_files import generated_files, rendered_answers, template_files, text_files, under
from conftest import LUSTRE_LAYOUT, TEMPLATE_DIR, answers, run


def test_exact_file_set(baked, post_gen_hook):
    name, path = baked
    package = path.name.replace("-", "_")
    files = generated_files(path)
    everything = template_files(package)
    a = answers(name) | {"package_name": package}  # as rendered
    dropped = under(everything, post_gen_hook.unchosen_files(a))
    assert files == everything - dropped
    # each part of the package is there exactly when the workload keeps it (a part's folder may
    # hold another part's modules: the training part's models/ holds the GPT)
    for part, paths in post_gen_hook.WORKLOAD_PARTS.items():
        wanted = part in post_gen_hook.WORKLOADS[a["workload"]]
        paths = [p.format(package=package) for p in paths]
        assert under(everything, paths), part
        assert bool(under(files, paths)) == wanted, part
        assert not wanted or under(everything, paths) - dropped <= files, part
    # each optional file is there exactly when its answer chose it
    for key, choices in post_gen_hook.OPTIONAL_FILES.items():
        for choice, paths in choices.items():
            wanted = a[key] in (choice, post_gen_hook.KEEPS_ALL.get(key))
            assert (under(everything, paths) <= files) == wanted, (key, choice)
            assert bool(under(files, paths)) == wanted, (key, choice)
    for always in (
        "README.md",
        "pyproject.toml",
        ".gitignore",
        "docs/answers.md",
        "docs/your-program.md",
        "scripts/setup_venv.sh",
        "scripts/stripe_lustre.sh",
        "jobs/common.sh",
        "logs/.gitkeep",
        f"src/{package}/__main__.py",
    ):
        assert always in files


def test_a_workload_keeps_every_file_of_a_part_or_none(post_gen_hook):
    """Every path of WORKLOAD_PARTS is a file or folder of the template, the default workload
    (`all`) keeps every part, and each workload of cookiecutter.json has a row."""
    everything = template_files("pkg")
    for part, paths in post_gen_hook.WORKLOAD_PARTS.items():
        for path in paths:
            assert under(everything, [path.format(package="pkg")]), (part, path)
    choices = answers("default")
    assert choices["workload"] == "all"
    assert set(post_gen_hook.WORKLOADS["all"]) == set(post_gen_hook.WORKLOAD_PARTS)
    listed = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text())["workload"]
    assert list(post_gen_hook.WORKLOADS) == listed


def test_design_lists_the_optional_files(post_gen_hook):
    """docs/DESIGN.md's generated-repository table names each optional file with its answer."""
    rows = [
        line
        for line in (TEMPLATE_DIR / "docs" / "DESIGN.md").read_text().splitlines()
        if line.startswith("| `")
    ]
    for key, choices in post_gen_hook.OPTIONAL_FILES.items():
        for choice, paths in choices.items():
            row = [r for r in rows if f"| {key}={choice} |" in r]
            assert len(row) == 1, f"DESIGN.md needs one row for {key}={choice}"
            listed = set(re.findall(r"`([^`]+)`", row[0].split(" | ")[0]))
            assert {p.rstrip("/") for p in listed} == set(paths), (key, choice)
    # each part's configs and pages, in the rows marked with the workloads that keep the part
    for part, paths in post_gen_hook.WORKLOAD_PARTS.items():
        keeping = [w for w, parts in post_gen_hook.WORKLOADS.items() if part in parts]
        listed = {
            name.rstrip("/")
            for row in rows
            if f"| workload={', '.join(keeping)} |" in row
            for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])
        }
        outside_package = [p for p in paths if not p.startswith(("src/", "tests/"))]
        assert set(outside_package) <= listed, (part, set(outside_package) - listed)


# Openers are what an unrendered template leaves behind; closers alone ("%}", "}}") occur in
# ordinary Python such as f"{share:.0%}" and nested dict literals.
JINJA_MARKERS = re.compile(r"\{\{|\{%|\{#|cookiecutter\.")


def test_no_leftover_jinja(baked):
    name, path = baked
    for rel in sorted(generated_files(path)):
        text = (path / rel).read_text(errors="replace")
        found = JINJA_MARKERS.search(text)
        assert not found, f"{name}: {rel} contains {found.group()!r}"


def test_no_template_file_spells_the_default_package_name():
    """A generated file names its package through Jinja: a literal `alps_torch_project` (the
    default answer's) breaks every other project name (a generated test imported it once)."""
    slug = TEMPLATE_DIR / "{{cookiecutter.project_slug}}"
    literal = [
        str(path.relative_to(slug))
        for path in sorted(slug.rglob("*"))
        if path.is_file() and b"alps_torch_project" in path.read_bytes()
    ]
    assert not literal


def test_toml_files_parse(baked):
    _, path = baked
    tomls = [p for p in path.rglob("*.toml") if ".git" not in p.parts]
    assert tomls
    for toml in tomls:
        tomllib.loads(toml.read_text())


def test_pyproject_keeps_torch_loose(baked):
    _, path = baked
    project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
    assert project["name"] == path.name
    assert project["requires-python"] == ">=3.10"
    torch_req = [d for d in project["dependencies"] if d.startswith("torch")]
    assert torch_req == ["torch>=2.4"]


def test_secrets_are_ignored_by_git(bake, tmp_path):
    path = bake("uenv-torchrun")  # git_init=false: a copy with its own git
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(path / ".gitignore", repo / ".gitignore")
    run(["git", "init", "--quiet"], cwd=repo)
    secrets = [
        ".env",
        ".env.local",
        "server.key",
        "certs/site.pem",
        ".netrc",
        "credentials.json",
        "gcp-credentials.json",
        "hf_token",
        "hf_token.txt",
        ".huggingface/token",
        ".cache/huggingface/token",
        ".wandb/settings",
        "wandb/run-20250101_000000-abc/files/config.yaml",
        "id_ed25519",
    ]
    proc = run(["git", "check-ignore", "--no-index", *secrets], cwd=repo, check=False)
    assert proc.stdout.split() == secrets
    kept = ["configs/default.toml", ".env.example", "src/keys.py", "docs/credentials.md"]
    proc = run(["git", "check-ignore", "--no-index", *kept], cwd=repo, check=False)
    assert proc.stdout.split() == []


def test_each_fact_is_written_once(baked):
    """The image file, the base image, the Lustre layout, TORCH_NCCL_ASYNC_ERROR_HANDLING and
    the partition each live in one place of the generated repo; the rest reads them from there."""
    name, path = baked
    a = answers(name)
    # the generated repo's own tests hold fixtures (test tables), not facts of this repo
    files = {rel: text for rel, text in text_files(path).items() if not rel.startswith("tests/")}

    def holders(fact: str, among=None) -> dict[str, int]:
        return {
            rel: text.count(fact)
            for rel, text in files.items()
            if fact in text and (among is None or rel.startswith(among))
        }

    if a["env_flavour"] != "uenv":
        extended = a["container_base"] == "alps-extended"
        tag = a["__alps_extended_tag"] if extended else a["__ngc_pytorch_tag"]
        sqsh = f"{a['image_dir']}/{path.name}+{tag}.sqsh"
        base = (
            f"ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:{tag}"
            if extended
            else f"nvcr.io/nvidia/pytorch:{tag}-py3"
        )
        assert holders(sqsh) == {"container/edf.toml": 1}
        assert holders(f"{path.name}+{tag}") == {"container/edf.toml": 1}
        assert holders(base) == {"Dockerfile": 1}
    # the linter's advice and the doctor's read it from there (tests hold fixtures of it)
    assert holders(LUSTRE_LAYOUT) == {"scripts/stripe_lustre.sh": 1}
    jobs = {rel for rel in files if rel.endswith(".sbatch")}
    # the part both job scripts share is written once (jobs/common.sh, sourced by each)
    assert holders("TORCH_NCCL_ASYNC_ERROR_HANDLING=") == {"jobs/common.sh": 1}
    assert holders('scontrol requeue "${job_ref}"') == {"jobs/common.sh": 1}
    assert holders('RUN_NAME="${RUN_NAME:-${SLURM_JOB_NAME}}"') == {"jobs/common.sh": 1}
    assert holders(f"--partition={a['partition']}") == dict.fromkeys(jobs, 1)
    if a["account"]:
        assert holders(f"--account={a['account']}") == dict.fromkeys(jobs, 1)
    # the directories: scripts/dirs.sh for the scripts, the EDF's mounts (TOML cannot source
    # it); docs show them to copy (answers.md records the answers)
    docs = {rel for rel in files if rel.endswith(".md")}
    container = a["env_flavour"] != "uenv"
    rendered = rendered_answers(name)
    for answer in ("data_dir", "checkpoint_dir", "image_dir"):
        held = holders(f'"{rendered[answer]}"')
        held = {rel: n for rel, n in held.items() if rel not in docs}
        expected = {"scripts/dirs.sh": 1}
        if container and answer != "image_dir":
            expected["container/edf.toml"] = 1
        if answer == "image_dir" and not container:
            expected = {}
        assert held == expected, (answer, held)
        code = {rel for rel in files if rendered[answer] in files[rel]} - docs
        assert code == set(expected) | ({"container/edf.toml"} if container else set()), code


def test_git_init(baked):
    name, path = baked
    if answers(name)["git_init"]:
        log = run(["git", "log", "--oneline"], cwd=path).stdout.splitlines()
        assert len(log) == 1
        assert run(["git", "status", "--porcelain"], cwd=path).stdout == ""
        assert run(["git", "branch", "--show-current"], cwd=path).stdout.strip() == "main"
    else:
        assert not (path / ".git").exists()


def test_regenerating_over_a_repo_adds_no_commit(bake, tmp_path):
    """cookiecutter -f over an existing generated repo re-runs the hooks: no second git init
    or commit, and the regenerated files equal the committed ones."""
    original = bake("default")
    out = tmp_path / "out"
    shutil.copytree(original, out / original.name, symlinks=True)
    head = run(["git", "rev-parse", "HEAD"], cwd=out / original.name).stdout
    run(
        [
            sys.executable,
            "-m",
            "cookiecutter",
            "--no-input",
            "-f",
            "-o",
            str(out),
            str(TEMPLATE_DIR),
        ],
        cwd=tmp_path,
    )
    repo = out / original.name
    assert run(["git", "rev-parse", "HEAD"], cwd=repo).stdout == head
    assert run(["git", "rev-list", "--count", "HEAD"], cwd=repo).stdout.strip() == "1"
    assert run(["git", "status", "--porcelain"], cwd=repo).stdout == ""


def test_the_hook_and_the_layout_test_class_the_generated_tests_alike(post_gen_hook):
    """The generated tests/test_layout.py's TEST_FILES (which a user's repository checks its
    tests against) and the hook's WORKLOAD_PARTS (which drops them) name the same files."""
    source = TEMPLATE_DIR / "{{cookiecutter.project_slug}}" / "tests" / "test_layout.py"
    text = source.read_text().replace("{{ cookiecutter.package_name }}", "pkg")
    tree = ast.parse(re.sub(r"{%.*?%}", "", text))
    (table,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TEST_FILES"
    ]
    listed = {part: set(names.split()) for part, names in ast.literal_eval(table).items()}
    in_hook = {
        part: {Path(p).stem for p in paths if p.startswith("tests/")}
        for part, paths in post_gen_hook.WORKLOAD_PARTS.items()
    }
    assert in_hook == {
        "training": listed["shared"],
        **{w: listed[w] for w in in_hook if w != "training"},
    }
    every = {p.stem for p in (source.parent).glob("*.py")} - set().union(*in_hook.values())
    assert every == listed["program"]
