"""Finish the generated repository: drop unchosen flavours, stripe Lustre, git init.

Runs inside the new repository. Safe to run again on the same tree: every step checks
before it acts. `cruft update` and `cruft diff` also run it, in scratch renders that they only
diff (see cruft_scratch_render); there it removes the unchosen flavours and nothing else.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# In cookiecutter's own order (tojson sorts keys): the order cruft writes them to .cruft.json.
ANSWER_ORDER: list = {{cookiecutter.keys() | list | tojson}}
ANSWERS: dict = json.loads({{cookiecutter | tojson | tojson}})
ANSWERS = {key: ANSWERS[key] for key in ANSWER_ORDER}

# The one list of files that belong to one answer only: {answer: {choice: paths}}. A choice
# not listed keeps every file ("both" keeps the container and the uenv files, "none" drops all
# CI files). tests/test_bake_file_set.py and docs/DESIGN.md are checked against this table.
OPTIONAL_FILES: dict[str, dict[str, list[str]]] = {
    "env_flavour": {
        "container": [
            "Dockerfile",
            ".dockerignore",
            "container",
            "scripts/build_image.sh",
            "jobs/train_container.sbatch",
        ],
        "uenv": ["jobs/train_uenv.sbatch"],
    },
    "ci": {
        "github": [".github"],
        "gitlab": [".gitlab-ci.yml"],
    },
}
KEEPS_ALL = {"env_flavour": "both"}

# The parts of the repository that only some workloads (the `workload` answer) use:
# {part: paths}, `{package}` standing for src/<package_name>. A path in no part is in every
# bake: the environment, the job scripts, the venv and Lustre scripts, the doctor, the run
# directory's lock, preemption and requeue (run/), the linter and pre-commit, docs/your-program.md.
# A workload keeps the parts WORKLOADS names; one more workload is one more row there (and the
# parts it splits off, rows here). tests/test_bake_file_set.py and docs/DESIGN.md are checked
# against these two tables.
PKG = "src/{package}"


def modules(*names: str) -> list[str]:
    """Package modules as paths: "models.gpt" -> src/{package}/models/gpt.py."""
    return [f"{PKG}/{name.replace('.', '/')}.py" for name in names]


def tests(names: str) -> list[str]:
    return [f"tests/{name}.py" for name in names.split()]


WORKLOAD_PARTS: dict[str, list[str]] = {
    # the training package every training workload shares: the MLP and the arrays kind, the
    # training loop, checkpoints, evaluation, the `file` export, plots, the benchmark; its
    # configs, docs and tests. The language and images parts below plug into its registries.
    "training": [
        "configs",
        *(f"docs/{page}.md" for page in ("data", "profiling", "scale", "training", "your-data")),
        "docs/your-model.md",
        *(f"{PKG}/{folder}" for folder in ("checkpoint", "config", "data", "make_dataset")),
        *(f"{PKG}/{folder}" for folder in ("models", "telemetry", "training")),
        f"{PKG}/optim.py",
        f"{PKG}/parallel.py",
        *modules(*(f"commands.{name}" for name in ("arguments", "benchmark", "compare"))),
        *modules(*(f"commands.{name}" for name in ("evaluate", "export", "keys"))),
        *modules(*(f"commands.{name}" for name in ("make_dataset", "plan", "plot", "train"))),
        # the generated tests of those modules (the other tests are every bake's)
        *tests(
            """
            _ckpt_driver test_checkpoint test_checkpoint_dcp test_cli test_cli_style
            test_compare test_config test_config_files test_console test_data
            test_error_boundary test_evaluate test_hostile_data test_init_from test_non_finite
            test_preemption test_prefetch test_profiling test_resume test_run_integrity
            test_rundir test_second_signal test_tracking test_train _plan test_plan _layouts
            """
        ),
    ],
    # language models: the GPT, any Hugging Face causal LM, LoRA, token and chat data,
    # tokenizers, the hf and peft exports, generate and train-tokenizer
    "language": [
        "docs/finetune.md",
        "configs/experiments/finetune-gpt2.toml",
        "configs/experiments/tiny-wide.toml",
        *modules("models.gpt", "models.gpt_hf", "models.hf", "models.lora"),
        *modules("data.tokens", "data.windows", "data.chat", "data.tokenizer"),
        *modules("data.recorded_tokenizer", "checkpoint.hf_format", "checkpoint.initial_hf"),
        *modules("checkpoint.lora", "checkpoint.export_hf", "checkpoint.export_peft"),
        *modules("make_dataset.tokens", "make_dataset.text_files", "make_dataset.hf_datasets"),
        *modules("make_dataset.chat", "make_dataset.chat_template", "make_dataset.chat_worker"),
        *modules("make_dataset.tokenizer", "make_dataset.benchmark"),
        *modules("commands.generate", "commands.train_tokenizer"),
        *tests(
            """
            _language test_benchmark_tokens test_chat test_chat_template test_config_files_gpt
            test_evaluate_tokens test_generate test_gpt test_hf_data test_hf_export test_hf_gpt2
            test_hf_model test_hf_sources test_hostile_tokens test_language_runs test_lora
            test_tokens test_plan_language
            """
        ),
    ],
    # image classifiers: torchvision and timm models, image datasets, augmentation
    "images": [
        "docs/vision.md",
        "configs/experiments/resnet50-images.toml",
        *modules("models.vision", "models.timm", "data.images", "data.augmentation"),
        *modules("data.preprocessing", "make_dataset.images", "make_dataset.image_check"),
        *tests(
            """
            test_augmentation test_benchmark_images test_hostile_images test_image_formats
            test_images test_timm test_vision test_vision_resume
            """
        ),
    ],
}
WORKLOADS: dict[str, tuple[str, ...]] = {
    "all": ("training", "language", "images"),
    "language": ("training", "language"),
    "images": ("training", "images"),
    "program": (),  # your own program through the job scripts
}

# The one source of the layout is cookiecutter.json's _lustre_layout (private: not asked).
LUSTRE_LAYOUT = ANSWERS["_lustre_layout"]


def unchosen_files(answers: dict) -> list[str]:
    """Paths of the optional files the answers did not choose."""
    drop = []
    for key, files in OPTIONAL_FILES.items():
        chosen = answers.get(key)
        if chosen == KEEPS_ALL.get(key):
            continue
        drop += [path for choice, paths in files.items() if choice != chosen for path in paths]
    return drop + unused_parts(answers)


def unused_parts(answers: dict) -> list[str]:
    """Paths of the parts the workload does not use (a .cruft.json from before the answer
    existed has none: all)."""
    kept = WORKLOADS[answers.get("workload", "all")]
    package = answers["package_name"]
    return [
        path.format(package=package)
        for part, paths in WORKLOAD_PARTS.items()
        if part not in kept
        for path in paths
    ]


def remove_unchosen_files(answers: dict) -> None:
    for rel in unchosen_files(answers):
        path = Path(rel)
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def lustre_dirs(answers: dict) -> list[str]:
    dirs = [answers["data_dir"], answers["checkpoint_dir"]]
    if answers["env_flavour"] != "uenv":
        dirs.append(answers["image_dir"])
    return dirs


def stripe_lustre(answers: dict) -> None:
    """Apply the layout where lfs exists and the paths resolve; otherwise print how to."""
    dirs = lustre_dirs(answers)
    resolved = [os.path.expandvars(d) for d in dirs]
    if shutil.which("lfs") and not any("$" in d for d in resolved):
        result = subprocess.run(["bash", "scripts/stripe_lustre.sh", *resolved], check=False)
        if result.returncode == 0:
            return
        print(
            "warning: striping failed; run scripts/stripe_lustre.sh later",
            file=sys.stderr,
        )
        return
    print("Lustre striping not applied here (no lfs: not on Alps). On Alps, run")
    print("  scripts/stripe_lustre.sh")
    print("which creates and stripes these directories:")
    for d in dirs:
        print(f'  mkdir -p "{d}" && lfs setstripe {LUSTRE_LAYOUT} "{d}"')


def inside_git_work_tree() -> bool:
    result = subprocess.run(
        ["git", "rev-parse", "--is-inside-work-tree"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0 and result.stdout.strip() == "true"


def wants_git(answers: dict) -> bool:
    """git_init is a boolean; .cruft.json files of older template versions hold "yes"/"no"."""
    return answers["git_init"] in (True, "yes")


# Used when neither git's configuration nor the author answers make an identity git accepts
# (git refuses names made only of '.', ',', '<', '>' ... and an empty e-mail).
FALLBACK_IDENTITY = ("alps-torch-template", "alps-torch-template@localhost")


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False)


def first_commit(answers: dict) -> str | None:
    """Commit everything; returns the identity used when it was not the configured one
    (None: git's own configuration), or raises RuntimeError when git refuses every identity."""
    message = "Initial commit from alps-torch-template"
    base = ["-c", "commit.gpgsign=false"]  # a signing setup without a key would fail here
    attempts: list[tuple[str | None, list[str]]] = []
    if git("config", "user.name").stdout.strip() and git("config", "user.email").stdout.strip():
        attempts.append((None, []))
    for name, email in (
        (answers["author_name"], answers["author_email"]),
        FALLBACK_IDENTITY,
    ):
        identity = ["-c", f"user.name={name}", "-c", f"user.email={email}"]
        attempts.append((f"{name} <{email}>", identity))
    errors = []
    for label, identity in attempts:
        result = git(*base, *identity, "commit", "--quiet", "--no-verify", "-m", message)
        if result.returncode == 0:
            return label
        errors.append(result.stderr.strip().splitlines()[-1:] or ["?"])
    raise RuntimeError("; ".join(e[0] for e in errors))


def git_init(answers: dict) -> None:
    """git init and a first commit. Never fails the generation: cookiecutter would delete the
    whole project for a failed post-generation hook; a git problem is reported instead."""
    if not wants_git(answers):
        return
    if shutil.which("git") is None:
        print("git not found: skipped git init (run it yourself later)", file=sys.stderr)
        return
    if inside_git_work_tree():  # a re-run, or generated inside another repository
        return
    if git("init", "--quiet", "--initial-branch=main").returncode or git("add", "--all").returncode:
        print("warning: git init failed; run git init yourself", file=sys.stderr)
        return
    try:
        used = first_commit(answers)
    except RuntimeError as err:
        print(f"warning: the first commit failed ({err}); commit yourself", file=sys.stderr)
        return
    if used == "{} <{}>".format(*FALLBACK_IDENTITY):
        print(
            f"note: git has no usable identity here: the first commit is authored by {used}; "
            "set yours with git config --global user.name/user.email "
            "(git commit --amend --reset-author rewrites it)"
        )
    elif used:
        print(f"note: no git identity configured: the first commit is authored by {used}")


# tempfile.mkdtemp() names: "tmp" + 8 characters from tempfile's alphabet.
_MKDTEMP_NAME = re.compile(r"tmp[a-z0-9_]{8}")


def generated_by_cruft(answers: dict) -> bool:
    """True under cruft (create, update, diff): only cruft adds `_commit` to the answers."""
    return "_commit" in answers


def cruft_scratch_render(answers: dict) -> bool:
    """True when cruft renders the template only to diff it (`cruft update`, `cruft diff`).

    cruft 2.x renders the old and the new template version with cookiecutter's
    generate_files into a fresh tempfile.TemporaryDirectory() (<tmp>/tmpXXXXXXXX/<slug>),
    moves the result away and diffs the two trees. Anything the hook adds there (a .git
    directory) would end up in the diff; printed instructions would appear twice per update.
    `cruft create` renders into the output directory the user chose instead (only a bare
    mkdtemp() directory given as --output-dir would be taken for a scratch render).
    """
    if not generated_by_cruft(answers):
        return False
    here = Path.cwd().resolve()
    parent = here.parent
    return (
        _MKDTEMP_NAME.fullmatch(parent.name) is not None
        and parent.parent == Path(tempfile.gettempdir()).resolve()
        and [p.name for p in parent.iterdir()] == [here.name]
    )


def cruft_state(answers: dict) -> str:
    """The .cruft.json that `cruft create` writes once this hook has run (cruft #155), byte for
    byte (cruft's json_dumps of template, commit, checkout, context, directory), so that the
    first commit can hold it. A `cruft create --checkout/--directory/--skip` writes other
    values: cruft then leaves the file modified, and main() says to commit it."""
    state = {
        "template": answers["_template"],
        "commit": answers["_commit"],
        "checkout": None,
        "context": {"cookiecutter": answers},
        "directory": None,
    }
    return json.dumps(state, ensure_ascii=False, indent=2, separators=(",", ": ")) + "\n"


def main() -> int:
    remove_unchosen_files(ANSWERS)
    if cruft_scratch_render(ANSWERS):
        return 0  # the project itself is left to cruft's diff and git apply
    stripe_lustre(ANSWERS)
    by_cruft = generated_by_cruft(ANSWERS) and not Path(".cruft.json").exists()
    if by_cruft and wants_git(ANSWERS) and not inside_git_work_tree():
        Path(".cruft.json").write_text(cruft_state(ANSWERS), encoding="utf-8")
    git_init(ANSWERS)
    if by_cruft and wants_git(ANSWERS):
        print("The first commit holds .cruft.json as cruft writes it; if `git status` shows it")
        print("modified (cruft create --checkout/--directory), commit it before `cruft update`:")
        print("  git add .cruft.json && git commit -m 'Record the template version (cruft)'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
