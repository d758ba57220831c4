"""The hostile answers the template's tests try, and the table of docs/hostile-answers.md made
from them: BAD_ANSWERS (refused, tests/test_answers_refused.py) and ACCEPTED_CASES (accepted on
purpose, each with the test that shows it). `python3 tests/hostile_answers.py` prints the table."""

from __future__ import annotations

# Choice and yes/no answers: cookiecutter checks them while loading cookiecutter.json, before
# the pre-generation hook; hooks/pre_prompt.py checks them first (from the command line).
PRE_PROMPT_FIELDS = ("cluster", "env_flavour", "container_base", "launcher", "ci", "git_init")


LATIN1_NAME = "caf\udce9"  # the byte 0xE9 (Latin-1 e-acute) as Python passes it on undecoded


LONG = "x" * 300


# (field, bad value, a phrase of the accepted form the message must show). This list is also
# the table of docs/hostile-answers.md (test_hostile_answers_table_is_current).
BAD_ANSWERS = [
    ("project_slug", "My Project", "lowercase letters and digits"),
    ("project_slug", "x" * 65, "at most 64 characters"),
    ("project_slug", "a/b", "lowercase letters and digits"),
    ("project_slug", "../escape", "lowercase letters and digits"),
    ("package_name", "1abc", "Python identifier"),
    ("package_name", "a" * 256, "at most 64 characters"),
    ("package_name", "json", "does not shadow"),
    ("package_name", "class", "does not shadow"),
    ("package_name", "pip", "does not shadow"),
    ("package_name", "setuptools", "does not shadow"),
    ("package_name", "pytest", "does not shadow"),
    ("package_name", "matplotlib", "does not shadow"),
    # installed with torch or an extra (derived: test_dependency_modules_are_refused)
    ("package_name", "mpmath", "does not shadow"),
    ("package_name", "torchgen", "does not shadow"),
    ("package_name", "dill", "does not shadow"),
    ("package_name", "pyarrow", "does not shadow"),
    ("package_name", "safetensors", "does not shadow"),
    ("package_name", "transformers", "does not shadow"),
    ("package_name", "triton", "does not shadow"),
    ("package_name", "nvidia", "does not shadow"),
    ("package_name", "flash_attn", "does not shadow"),
    ("package_name", "test", "does not shadow"),
    ("package_name", "conftest", "does not shadow"),
    ("package_name", "sitecustomize", "imports at start-up"),
    ("package_name", "usercustomize", "imports at start-up"),
    ("project_name", "two\nlines", "no newlines"),
    ("project_name", LATIN1_NAME, "valid UTF-8"),
    ("project_name", "x" * 101, "at most 100 characters"),
    ("project_name", "!!!", "at least one letter or digit"),
    ("project_name", "Foo ", "no leading or trailing spaces"),
    ("project_name", " Foo", "no leading or trailing spaces"),
    ("project_name", "Foo\u00a0", "no leading or trailing spaces"),  # a no-break space
    ("project_name", "next\u0085line", "control character U+0085"),  # NEL
    ("project_name", "csi\u009b31m", "control character U+009B"),  # a C1 control
    ("project_name", "line\u2028sep", "line separator U+2028"),
    ("project_name", "para\u2029sep", "paragraph separator U+2029"),
    ("project_name", "\ufeffBOM", "format or bidi control character U+FEFF"),
    ("description", "safe \u202etxt.exe", "bidi control character U+202E"),  # RLO
    ("description", "isolate \u2066x\u2069", "bidi control character U+2066"),
    ("description", "zero\u200bwidth", "format or bidi control character U+200B"),
    ("description", "private \ue000", "private-use character U+E000"),
    ("description", "trailing ", "no leading or trailing spaces"),
    ("author_name", "Ada\u200f", "bidi control character U+200F"),  # RLM
    ("author_name", " Ada", "no leading or trailing spaces"),
    ("description", "tab\there", "no newlines, tabs"),
    ("description", "emoji \U0001f600", "printable characters"),
    ("description", "{% raw %}{{ config }}{% endraw %}", "no template syntax"),
    ("description", "{{ '{{' }} x }}", "no template syntax"),
    ("description", "{{ 6 * 7 }}", "no template syntax"),  # never evaluated, not even 6 * 7
    ("author_name", "", "not empty"),
    ("author_email", "not-an-email", "e-mail address"),
    ("author_email", 'a"@b.org', "e-mail address"),
    ("author_email", "a@" + "b" * 250 + ".org", "at most 254 characters"),
    ("author_email", ".a..b.@x.org", "dot-separated words"),  # pip could not install these
    ("author_email", "a.@b.org", "dot-separated words"),
    ("author_email", "a@b..org", "a domain name after it"),
    ("author_email", "a@-x.org", "a domain name after it"),
    ("author_email", "a@localhost", "a domain name after it"),
    ("author_email", "a" * 65 + "@x.org", "at most 64 characters"),
    ("author_email", "ada@example.org ", "e-mail address"),
    ("account", "a-g34; rm -rf ~", "Slurm account"),
    ("account", "$(id)", "Slurm account"),
    ("account", "a" * 65, "at most 64 characters"),
    ("partition", "normal\n#SBATCH --environment=x", "partition name"),
    ("partition", "", "partition name"),
    ("__derived_base_image", "nvcr.io/nvidia/pytorch:25.06-py3\nRUN id", "derived from"),
    ("__derived_image_sqsh", '/x/p+25.06.sqsh"; $(id)', "derived: <image_dir>"),
    ("__derived_image_tag", "../../etc", "derived from __ngc_pytorch_tag"),
    ("_lustre_layout", "-c 1 $(touch /tmp/x)", "lfs setstripe options"),
    ("_lustre_layout", "-c ٣٢", "lfs setstripe options"),
    ("cluster", "eiger", "one of clariden, daint, santis"),
    ("cluster", "Clariden", "in lowercase, as listed"),
    ("launcher", "SRUN", "in lowercase, as listed"),
    ("env_flavour", "docker", "one of container, uenv, both"),
    ("container_base", "ubuntu", "one of ngc, alps-extended"),
    ("launcher", "mpirun", "one of srun, torchrun"),
    ("ci", "jenkins", "one of github, gitlab, none"),
    ("git_init", "maybe", "true or false"),
    ("__ngc_pytorch_tag", "latest", "YY.MM"),
    ("__ngc_pytorch_tag", "\u0662\u0665.\u0660\u0666", "YY.MM"),  # Arabic-Indic digits
    ("__alps_extended_tag", "26.02", "YY.MM-py3-alpsN"),
    ("__uenv_image", "pytorch", "name/version[:tag]"),
    ("__uenv_image", "pytorch/v2.9.1:v1`id`", "name/version[:tag]"),
    ("nodes", "0", "whole number of nodes"),
    ("nodes", "-2", "whole number of nodes"),
    ("nodes", "two", "whole number of nodes"),
    ("nodes", "\uff11", "whole number of nodes"),  # a full-width digit one
    ("time_limit", "0", "Slurm time limit"),
    ("time_limit", "1:60:00", "Slurm time limit"),
    ("time_limit", "1-24", "Slurm time limit"),
    ("time_limit", "one hour", "Slurm time limit"),
    ("time_limit", "\u0661\u0662", "Slurm time limit"),  # Arabic-Indic 12
    ("time_limit", "99999999999999999999", "at most 16 characters"),
    ("time_limit", "8-00:00:00", "1 minute to 7 days"),
    ("image_dir", "$SCRATCH/images", "${SCRATCH}"),
    ("image_dir", "${IFS}", "${SCRATCH}, ${HOME} or ${STORE}"),
    ("image_dir", "${PATH}/images", "${SCRATCH}, ${HOME} or ${STORE}"),
    ("image_dir", "/x/${IFS}y", "${USER} after the start only"),
    ("data_dir", "${USER}/data", "${SCRATCH}, ${HOME} or ${STORE}"),  # relative
    ("data_dir", "${SCRATCH}data", "${SCRATCH}, ${HOME} or ${STORE}"),
    ("data_dir", "/data/${SCRATCH}", "${USER} after the start only"),
    ("data_dir", "${STORE}/", "not all of it"),
    ("image_dir", "/iopsstor", "shared or system root"),
    ("data_dir", "relative/data", "absolute path"),
    ("data_dir", '/scratch/"quoted"', "absolute path"),
    ("data_dir", "/", "shared or system root"),
    ("data_dir", "//users", "shared or system root"),
    ("data_dir", "/users", "shared or system root"),
    ("data_dir", "${HOME}", "whole home directory"),
    ("data_dir", "${HOME}/.", "whole home directory"),
    ("data_dir", "/users/${USER}/..", "without '..'"),
    ("data_dir", "${SCRATCH}/../..", "without '..'"),
    ("data_dir", "/" + LONG, "at most 255 characters"),
    ("checkpoint_dir", "/capstor/$(whoami)/runs", "absolute path"),
    ("checkpoint_dir", "/capstor/my runs", "absolute path"),
    ("checkpoint_dir", "/users/someone", "whole home directory"),
    ("checkpoint_dir", "/users/${USER}", "whole home directory"),
    ("checkpoint_dir", "/capstor/scratch/cscs", "shared or system root"),
    ("checkpoint_dir", "/capstor/store/cscs/swissai", "a shared root"),
]


# Hostile answers that are accepted on purpose: (what is tried, what happens, the test).
ACCEPTED_CASES = [
    (
        "free text with quotes, `$(...)`, backticks, `;`, `\\` and `<b>`",
        "accepted as data: TOML strings via JSON escaping, inert in every shell script",
        "test_free_text_is_rendered_safely",
    ),
    (
        "`author_name=.` or `<>` with no git identity configured",
        "the project is kept; the first commit is authored by "
        "`alps-torch-template <alps-torch-template@localhost>` and the hook says so",
        "test_first_commit_without_git_identity",
    ),
    (
        '`git_init="yes"`/`"no"` (from an older `.cruft.json`)',
        "accepted: cookiecutter turns them into true/false",
        "test_git_init_accepts_old_yes_no",
    ),
    (
        "Markdown in free text: `# x`, `* x`, `1. x`, `> x`, `<script>`, `[x](y)`, backticks, "
        "`|`, `~~x~~`, `$x$`, `&lt;`",
        "accepted and escaped: the README title and description and the docs/answers.md row "
        "render as exactly the text given (checked with a CommonMark parser)",
        "test_markup_in_free_text_renders_as_plain_text",
    ),
    (
        "e-mail forms such as `a.b.c@x.org`, `ada+alps@example.org`, `a_b%c-d@x-y.example.org`, "
        "`ada@xn--bcher-kva.ch`, a 64-character local part, a 63-character domain label",
        "accepted: setuptools builds the package metadata with each (listed and 40 random ones)",
        "test_every_accepted_email_form_builds_package_metadata",
    ),
    (
        "`${SCRATCH}/x`, `${HOME}/data`, `${STORE}/ds`, `/capstor/scratch/cscs/${USER}/r`",
        "accepted: the documented Alps variables, in the place where each makes an absolute path",
        "test_known_variables_in_paths_are_accepted",
    ),
    (
        "`project_name=!!!` with `project_slug=bangs`",
        "accepted: the slug given is used",
        "test_explicit_slug_rescues_a_name_without_letters",
    ),
]


def code(value: str) -> str:
    """A value as a Markdown code span in a table cell."""
    text = repr(value if len(value) <= 40 else value[:12])
    if len(value) > 40:
        text += f" + ... ({len(value)} characters)"
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}".replace("|", "\\|")


def hostile_table() -> str:
    """The table of docs/hostile-answers.md, made from BAD_ANSWERS and ACCEPTED_CASES."""
    rows = ["| answer | tried | what happens |", "|---|---|---|"]
    for field, value, form in BAD_ANSWERS:
        who = "the pre-prompt hook" if field in PRE_PROMPT_FIELDS else "the pre-generation hook"
        rows.append(f"| `{field}` | {code(value)} | refused by {who}: expected ...{form}... |")
    for tried, outcome, _ in ACCEPTED_CASES:
        rows.append(f"| | {tried} | {outcome} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(hostile_table(), end="")
