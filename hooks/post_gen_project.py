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

ANSWERS: dict = json.loads({{cookiecutter | tojson | tojson}})

# Files that belong to one flavour only ("both" keeps them all).
FLAVOUR_FILES = {
    "container": [
        "Dockerfile",
        ".dockerignore",
        "container",
        "scripts/build_image.sh",
        "jobs/train_container.sbatch",
    ],
    "uenv": ["jobs/train_uenv.sbatch"],
}

# Must match LAYOUT in scripts/stripe_lustre.sh (a template test checks that they agree).
LUSTRE_LAYOUT = "-E 4M -c 1 -E 64M -c 4 -E -1 -c 32 -S 4M"


def remove_unchosen_flavours(flavour: str) -> None:
    for name, paths in FLAVOUR_FILES.items():
        if flavour in (name, "both"):
            continue
        for rel in paths:
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


def git_init(answers: dict) -> None:
    if answers["git_init"] != "yes":
        return
    if shutil.which("git") is None:
        print("git not found: skipped git init (run it yourself later)", file=sys.stderr)
        return
    if inside_git_work_tree():  # a re-run, or generated inside another repository
        return
    identity: list[str] = []
    has_email = subprocess.run(
        ["git", "config", "user.email"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if not has_email:  # no git identity configured: commit as the template's author
        identity = [
            "-c",
            f"user.name={answers['author_name']}",
            "-c",
            f"user.email={answers['author_email']}",
        ]
    subprocess.run(["git", "init", "--quiet", "--initial-branch=main"], check=True)
    subprocess.run(["git", "add", "--all"], check=True)
    subprocess.run(
        [
            "git",
            *identity,
            "commit",
            "--quiet",
            "--no-verify",
            "-m",
            "Initial commit from alps-torch-template",
        ],
        check=True,
    )


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


def main() -> int:
    remove_unchosen_flavours(ANSWERS["env_flavour"])
    if cruft_scratch_render(ANSWERS):
        return 0  # the project itself is left to cruft's diff and git apply
    stripe_lustre(ANSWERS)
    git_init(ANSWERS)
    if generated_by_cruft(ANSWERS) and ANSWERS["git_init"] == "yes":
        # cruft writes .cruft.json after this hook has run (cruft #155).
        print("cruft writes .cruft.json after this first commit; commit it before `cruft update`:")
        print("  git add .cruft.json && git commit -m 'Record the template version (cruft)'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
