"""Shared fixtures: every named configuration is baked once per test session.

The configurations are chosen on purpose (see CONFIGS): together they cover every
env_flavour x launcher x container_base combination that changes a generated file,
and they cycle the independent answers (cluster, account, git_init) across them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

TEMPLATE_DIR = Path(__file__).resolve().parent.parent
# cookiecutter.json's Jinja extension (alps_torch_template_guard.py) is imported from the template
# directory, which cookiecutter and cruft put on sys.path while they render; the tests that
# render answers in this process (prompt_for_config) do the same.
sys.path.append(str(TEMPLATE_DIR))

# The real-Slurm tests' fixtures (slurm, cluster, repo, dataset): tests/slurm/fixtures.py.
pytest_plugins = ["slurm.fixtures"]

# name -> extra_context. Covered: container part {ngc, alps-extended} x {srun, torchrun}
# and uenv part x {srun, torchrun}; ci github (default), gitlab and none; workload all (every
# configuration but three), language, images and program.
CONFIGS: dict[str, dict[str, str | bool]] = {
    # --no-input defaults: clariden, container, ngc, srun, ci=github, git_init=true
    "default": {},
    "uenv-torchrun": {
        "env_flavour": "uenv",
        "launcher": "torchrun",
        "cluster": "daint",
        "ci": "none",
        "git_init": False,
        "nodes": "2",
    },
    "both-extended-srun": {
        "env_flavour": "both",
        "container_base": "alps-extended",
        "cluster": "santis",
        "account": "a-g34",
        "ci": "gitlab",
        "git_init": False,
    },
    "container-extended-torchrun": {
        "env_flavour": "container",
        "container_base": "alps-extended",
        "launcher": "torchrun",
        "partition": "debug",
        "time_limit": "30",
        "git_init": False,
    },
    "both-ngc-torchrun": {
        "env_flavour": "both",
        "launcher": "torchrun",
        "cluster": "daint",
        "account": "g34",
        "git_init": False,
    },
    # workload=language and workload=images, each with both flavours (their job scripts differ:
    # an images job's default dataset is synthetic, a language job's stdlib-bytes)
    "language": {
        "workload": "language",
        "env_flavour": "both",
        "launcher": "torchrun",
        "ci": "gitlab",
        "git_init": False,
    },
    "images": {
        "workload": "images",
        "env_flavour": "both",
        "cluster": "daint",
        "git_init": False,
    },
    # workload=program (no training package) with both flavours (its two job scripts and the
    # container and uenv pages), srun, GitHub CI, no account
    "program": {
        "workload": "program",
        "env_flavour": "both",
        "cluster": "santis",
        "git_init": False,
    },
}


def answers(name: str) -> dict:
    """The effective answers of a named configuration (cookiecutter.json defaults + overrides)."""
    defaults = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text())
    merged = {k: (v[0] if isinstance(v, list) else v) for k, v in defaults.items()}
    merged.update(CONFIGS[name])
    return merged


LUSTRE_LAYOUT = answers("default")["_lustre_layout"]  # the one source: cookiecutter.json


def load_hook(directory: Path, hook: str, answers: dict) -> ModuleType:
    """hooks/<hook>.py rendered for `answers` and imported from `directory` (main() not run)."""
    from cookiecutter.environment import StrictEnvironment

    source = (TEMPLATE_DIR / "hooks" / f"{hook}.py").read_text()
    rendered = directory / f"{hook}_{len(list(directory.glob(hook + '_*')))}.py"
    if str(TEMPLATE_DIR) not in sys.path:  # as cookiecutter does: the template's extension
        sys.path.append(str(TEMPLATE_DIR))
    extensions = json.loads((TEMPLATE_DIR / "cookiecutter.json").read_text())["_extensions"]
    env = StrictEnvironment(context={"cookiecutter": {"_extensions": extensions}})
    rendered.write_text(env.from_string(source).render(cookiecutter=answers))
    spec = importlib.util.spec_from_file_location(rendered.stem, rendered)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clean_env() -> dict[str, str]:
    """Environment for commands run inside a baked repo: no outer venv leaks in."""
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    # keep the interpreter running the tests first on PATH (it has torch installed)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def package_env(repo: Path) -> dict[str, str]:
    """Import the package from the checkout (src/), no install; one thread per process."""
    env = clean_env()
    env["PYTHONPATH"] = str(repo / "src")
    env["OMP_NUM_THREADS"] = "1"
    for key in [k for k in env if k.startswith("SLURM_")]:
        del env[key]
    return env


def run(cmd: list[str], cwd: Path, timeout: float = 600, check: bool = True, **kw):
    """Run a command in a baked repo and return the CompletedProcess (output captured)."""
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env=kw.pop("env", clean_env()),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, cmd))} failed ({proc.returncode}) in {cwd}\n"
            f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def assert_generated_suite_passes(repo: Path, *options: str, timeout: float) -> None:
    """A bake's own test suite passes, on two xdist workers that each take whole files (a
    file's tests keep their order and module fixtures; no core idles once the template's other
    tests are done). A user runs plain `python -m pytest` in one process; both ways pass."""
    proc = run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
        + ["-n", "2", "--dist", "loadfile", *options],
        cwd=repo,
        env=package_env(repo),
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


# Left out of the copies: artefacts other tests may have created in the shared baked repos.
COPY_IGNORE = shutil.ignore_patterns(
    ".venv*", "__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info", "runs"
)


@pytest.fixture(scope="session")
def pre_commit_env() -> dict[str, str]:
    """Environment with one PRE_COMMIT_HOME shared by all tests (and kept between sessions)."""
    env = clean_env()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    env["PRE_COMMIT_HOME"] = os.environ.get("PRE_COMMIT_HOME") or str(cache / "pre-commit")
    return env


def git_copy(baked_repo: Path, dest: Path, env: dict[str, str]) -> Path:
    """A copy of a baked repo that is a git work tree with every generated file tracked."""
    shutil.copytree(baked_repo, dest, symlinks=True, ignore=COPY_IGNORE)
    if not (dest / ".git").exists():  # git_init=no
        run(["git", "init", "--quiet"], dest, env=env)
        run(["git", "add", "--all"], dest, env=env)
    return dest


# pytest-xdist (pytest.ini: -n auto) runs the tests on one worker per core. Every real-Slurm
# test goes to one worker: one cluster of each kind at a time (the two-node module cuts its
# link), and the jobs' venvs made once. Their waits (requeue, timeouts, scheduler passes) then
# overlap the CPU-bound tests on the other worker, which starts with the longest single tests.
SLURM_MODULES = (
    "tests/test_slurm_e2e.py::",
    "tests/test_slurm_programs.py::",
    "tests/test_slurm_two_node.py::",
)
# the generated suite of the training parts, in the default bake
LONGEST = ("tests/test_training_package.py::test_generated_test_suite_passes",)
# The Slurm worker's order, whatever the modules' order: the two-node module first (its lost node
# and timeouts wait most, while the generated suite keeps both cores busy), the programs' batch of
# jobs last (its CPU, more than a core's, beside the small template tests that follow that suite).
SLURM_ORDER = ("tests/test_slurm_two_node.py::", "tests/test_slurm_e2e.py::")


def run_order(item: pytest.Item) -> tuple[bool, int]:
    """LONGEST first; the Slurm modules in SLURM_ORDER, then the others (a stable sort: tests
    keep their order within a module, and the other modules theirs)."""
    first = next((i for i, module in enumerate(SLURM_ORDER) if item.nodeid.startswith(module)), 2)
    return item.nodeid not in LONGEST, first


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=run_order)


def pytest_xdist_make_scheduler(config, log):
    """Each test its own unit of work, except the Slurm modules: one unit, handed out first (the
    largest). Written out because xdist's `loadgroup` marks do not group on pytest 9."""
    from xdist.scheduler import LoadScopeScheduling

    class SlurmOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "slurm" if nodeid.startswith(SLURM_MODULES) else nodeid

    return SlurmOnOneWorker(config, log)


@pytest.fixture(scope="session")
def bake(cookies_session):
    """bake(name) -> Path of the generated repo for CONFIGS[name], baked once per session."""
    cache: dict[str, Path] = {}

    def _bake(name: str) -> Path:
        if name not in cache:
            result = cookies_session.bake(extra_context=CONFIGS[name], template=str(TEMPLATE_DIR))
            assert result.exception is None, f"{name}: {result.exception!r}"
            assert result.exit_code == 0
            cache[name] = Path(result.project_path)
        return cache[name]

    return _bake


@pytest.fixture(scope="session")
def post_gen_hook(tmp_path_factory):
    """hooks/post_gen_project.py imported: OPTIONAL_FILES and unchosen_files are the one list of
    files that belong to one answer only."""
    return load_hook(tmp_path_factory.mktemp("hook"), "post_gen_project", answers("default"))


@pytest.fixture(scope="module")
def hooks(tmp_path_factory) -> tuple:
    """(pre_prompt, pre_gen_project): the template's two answer-checking hooks, imported."""
    directory = tmp_path_factory.mktemp("hooks")
    spec = importlib.util.spec_from_file_location(
        "pre_prompt", TEMPLATE_DIR / "hooks" / "pre_prompt.py"
    )
    pre_prompt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pre_prompt)  # run as it is: cookiecutter does not render this hook
    return pre_prompt, load_hook(directory, "pre_gen_project", answers("default"))


@pytest.fixture(scope="session", params=sorted(CONFIGS))
def baked(request, bake) -> tuple[str, Path]:
    """(name, path) for each named configuration."""
    return request.param, bake(request.param)
