"""Config file + overrides; errors name the key and the accepted values; the docs table."""

import dataclasses
import re

import pytest
from conftest import REPO, TINY

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config import settings
from {{ cookiecutter.package_name }}.config.resume import check_resume, check_run_dir_config
from {{ cookiecutter.package_name }}.config.settings import (
    GENERAL_KEYS,
    Config,
    ConfigError,
    config_record,
    docs_table,
    load_config,
    save_config,
    to_toml,
)
from {{ cookiecutter.package_name }}.config_keys import key, keys_of, read_toml
from {{ cookiecutter.package_name }}.models import MODELS, spec_of
from {{ cookiecutter.package_name }}.models.mlp import MLPKeys


def test_default_config_file_matches_the_declarations():
    """configs/default.toml spells out every general key and the default model's own keys (a
    dataset kind's own keys may be there too, not must: a kind you add is one module and one
    line), each at its declared default; `dataset` only in a comment, so that the job scripts'
    default (stdlib-bytes, below every file) applies when a job uses this file."""
    cfg, _ = load_config(REPO / "configs" / "default.toml")
    assert cfg == Config(), "configs/default.toml should hold the declared defaults"
    declared = [k.name for k in GENERAL_KEYS] + [k.name for k in keys_of(spec_of(cfg).keys)]
    spelled = set(read_toml(REPO / "configs" / "default.toml"))
    assert (
        set(declared) - {"dataset"}
        <= spelled
        <= set(declared) - {"dataset"} | set(settings.KIND_KEYS)
    )
    assert '\n# dataset = "synthetic"\n' in (REPO / "configs" / "default.toml").read_text()


def test_epochs_or_max_steps_the_one_set_last_gives_the_length(tmp_path, caplog):
    """A config file's max_steps, then epochs=N on the command line: N epochs (and the other
    way round); both in one source is refused. eval_every from TOML stays a number of steps."""
    path = tmp_path / "long.toml"
    path.write_text("max_steps = 10000\neval_every = 500\n")
    caplog.set_level("INFO")
    cfg, origins = load_config([path], ["epochs=3"])
    assert (cfg.epochs, cfg.max_steps, cfg.eval_every) == (3, Config().max_steps, "500")
    assert "max_steps" not in origins and origins["epochs"] == "command line"
    assert re.search(r"max_steps=10000 \(from .*long.toml\) is replaced by epochs=3", caplog.text)
    path.write_text("epochs = 3\n")
    cfg, _ = load_config([path], ["max_steps=20"])
    assert (cfg.epochs, cfg.max_steps) == (0, 20)
    with pytest.raises(ConfigError, match="command line sets both epochs and max_steps"):
        load_config(None, ["epochs=2", "max_steps=5"])


def test_a_config_files_dataset_beats_the_job_scripts_default(tmp_path, capsys, single_process):
    """Declared default < a job script's --job-default < config files < key=value: a job
    script never puts its default over a file's value (it trained on stdlib-bytes, silently)."""
    job = ["--job-default", f"dataset={tmp_path / 'stdlib-bytes'}"]
    base = tmp_path / "base.toml"
    base.write_text('dataset = "synthetic"\nlr = 0.002\n')
    assert load_config(None, [], job[1:]).config.dataset == str(tmp_path / "stdlib-bytes")
    cfg, origins = load_config([base], ["lr=0.003", "max_steps=2"], job[1:])
    assert origins == {"dataset": str(base), "lr": "command line", "max_steps": "command line"}
    assert (cfg.dataset, cfg.lr) == ("synthetic", 0.003)
    run_dir = tmp_path / "run"
    tiny = [item for item in TINY if not item.startswith(("dataset=", "lr="))]
    argv = ["--config", str(base), *job, *tiny, f"run_dir={run_dir}", "max_steps=2"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    (line,) = [line.split(" INFO ", 1)[1] for line in err.splitlines() if " INFO settings " in line]
    assert line.endswith("; other keys: their defaults"), line
    assert "job script default" not in line  # the file's dataset replaced it
    assert line.startswith(f"settings from {base}: dataset, lr; command line: device, model"), line
    saved = (run_dir / "config.toml").read_text().splitlines()
    assert saved[1] == f"# where the values came from: {line.removeprefix('settings from ')}"
    assert 'dataset = "synthetic"' in saved


def test_overrides_are_typed_by_the_fields(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('max_steps = 5\nlr = 1\nrun_dir = "a"\n')
    cfg, _ = load_config(path, ["lr=0.5", "compile=true", "run_dir=b", "checkpoint_every=30min"])
    assert (cfg.max_steps, cfg.lr, cfg.compile, cfg.run_dir) == (5, 0.5, True, "b")
    assert cfg.checkpoint_every == "30min" and isinstance(cfg.lr, float)


def test_unknown_key_names_it_and_lists_accepted_keys():
    with pytest.raises(ConfigError, match=r"'max_step'.*accepted keys:.*max_steps"):
        load_config(None, ["max_step=3"])


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("max_step", "max_steps"),
        ("Batch-Size", "batch_size"),
        ("learning_rate", None),
        ("x" * 100_000, None),
    ],
)
def test_unknown_key_suggests_the_closest_ones(typed, meant):
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"{typed}=3"])
    hint = str(error.value).split("accepted keys:")[0]
    assert len(hint) < 200, "a very long key is shown cut, with its length"
    if meant:
        assert f"did you mean {meant}" in hint, hint
    else:  # no near spelling: no guess
        assert "did you mean" not in hint, hint


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("max_steps=ten", r"'max_steps' expects an integer"),
        ("max_steps=1.5", r"'max_steps' expects an integer"),
        ("lr=fast", r"'lr' expects a number"),
        ("compile=maybe", r"'compile' expects true or false"),
        ("precision=fp8", r"'precision' must be one of auto, bf16, fp16, fp32"),
        ("checkpoint_every=often", r"'checkpoint_every' expects a number of steps"),
        ("checkpoint_every=\u0663epochs", r"'checkpoint_every' expects a number of steps"),
        ("eval_every=1e3", r"'eval_every' expects a number of steps \("),
        ("eval_every=30min", r"'eval_every' expects .*epochs \(\"1epoch\""),
        ("eval_every=\u0661epoch", r"'eval_every' expects"),  # Arabic-Indic 1
        ("eval_every=0epochs", r"'eval_every': epochs must be above 0"),
        ("eval_every=" + "9" * 13, r"'eval_every' expects"),
        ("epochs=-1", r"'epochs' must be in \[0, "),
        ("epochs=1.5", r"'epochs' expects an integer"),
        ("epochs=max_steps=2", r"'epochs' expects an integer"),
        ("keep_checkpoints=1", r"'keep_checkpoints' must be in \[2, "),
        ("batch_size=0", r"'batch_size' must be in \[1, "),
        ("max_steps", r"not of the form key=value"),
        ("seed=-1", r"'seed' must be in \[0, 4294967295\]"),
        ("seed=99999999999999999999999", r"'seed' must be in"),
        ("cpu_threads=100000", r"'cpu_threads' must be in \[0, 1024\]"),
        ("num_workers=-5", r"'num_workers' must be in \[-1, 256\]"),
        ("max_steps=\u0661\u0662", r"'max_steps' expects an integer"),  # Arabic-Indic 12
        ("run_dir=a\nb", r"'run_dir' expects one line of printable text"),
        ("device=gpu", r"'device' must be one of auto, cpu, cuda"),
        ("parallelism=zero3", r"'parallelism' must be one of ddp, fsdp, hsdp"),
        ("hsdp_shard=-1", r"'hsdp_shard' must be in \[0, 1000000\]"),
        ("model=llama", r"'model' must be one of (.+, )?mlp"),  # the models of this repository
        ("run_dir=", r"'run_dir' must not be empty"),
        ("dropout=1", r"'dropout' must be in \[0, 1\), got 1.0"),
        ("lr=0", r"'lr' must be in \(0, 1000\], got 0.0"),
    ],
)
def test_bad_values_name_the_key_and_the_accepted_form(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["lr=0.001", "min_lr=0.01"], r"'min_lr' \(0.01\) must not exceed 'lr' \(0.001\)"),
        (["model=mlp", "activation_checkpointing=true"], r"needs a model with repeated blocks"),
    ],
)
def test_relations_between_keys_are_checked_at_load(overrides, message):
    """The GPT's and a key of another model: test_language_runs.py."""
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_bad_value_in_file_names_the_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('dropout = "high"\n')
    with pytest.raises(ConfigError, match="'dropout' expects a number"):
        load_config(path)
    path.write_text("max_steps = [1, 2]\n")
    with pytest.raises(ConfigError, match="'max_steps' expects an integer"):
        load_config(path)


def test_config_file_that_is_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_bytes(b'run_dir = "\xff\xfe"\n')
    with pytest.raises(ConfigError, match="not valid UTF-8 TOML"):
        load_config(path)


def test_saved_config_round_trips(tmp_path):
    cfg, _ = load_config(None, ["model=mlp", 'run_dir=with "quotes"', "lr=0.25", "hidden_dim=48"])
    (tmp_path / "c.toml").write_text(to_toml(cfg))
    assert load_config(tmp_path / "c.toml").config == cfg
    assert to_toml(cfg).endswith("\n\n[mlp]\nhidden_dim = 48\n")  # the run's model's table only


def test_check_resume(caplog):
    saved = config_record(Config(model="mlp"))
    with pytest.raises(ConfigError, match="hidden_dim: 256 -> 7"):
        check_resume(saved, Config(model="mlp", mlp=MLPKeys(hidden_dim=7)), 2, 2)
    check_resume(saved, Config(model="mlp", log_every=3, run_dir="elsewhere"), 2, 2)  # harmless
    with pytest.raises(ConfigError, match="batch_size: 16 -> 64"):
        check_resume(saved, Config(model="mlp", batch_size=64), 2, 2)
    check_resume(saved, Config(model="mlp"), 2, 4)  # another world size reshards the checkpoint
    assert "world size 2 -> 4" in caplog.text
    with pytest.raises(ConfigError, match=r"fingerprint aaaa.*\(the files at synthetic were rew"):
        check_resume(saved, Config(model="mlp"), 2, 2, "aaaa" * 16, "bbbb" * 16)
    check_resume(saved, Config(model="mlp", batch_size=64, force_resume=True), 2, 2, "a", "b")
    # a copied run continued on other data: not "rewritten" files, another dataset
    caplog.clear()
    check_resume(
        saved, Config(model="mlp", dataset="data/other", force_resume=True), 2, 2, "a", "b"
    )
    assert "(another dataset: synthetic -> data/other)" in caplog.text
    assert "rewritten" not in caplog.text


def test_run_dir_config_is_compared_before_any_checkpoint_is_read(tmp_path):
    save_config(load_config(None, ["model=mlp", "hidden_dim=32"]).config, tmp_path / "config.toml")
    assert "\n[mlp]\nhidden_dim = 32\n" in (tmp_path / "config.toml").read_text()
    other, _ = load_config(None, ["model=mlp", "lr=0.001"])
    with pytest.raises(ConfigError, match=r"lr: 0.0006 -> 0.001; hidden_dim: 32 -> 256") as err:
        check_run_dir_config(other, tmp_path, has_checkpoints=True)
    assert "new run_dir" in str(err.value) and "\n" not in str(err.value)
    check_run_dir_config(other, tmp_path, has_checkpoints=False)  # nothing to continue
    same, _ = load_config(None, ["model=mlp", "mlp.hidden_dim=32", "log_every=1"])
    check_run_dir_config(same, tmp_path, True)
    (tmp_path / "config.toml").write_text("not = [toml")
    check_run_dir_config(other, tmp_path, has_checkpoints=True)  # checked after loading instead


def test_cli_exit_status_2_and_message_for_config_errors(capsys):
    assert main(["--config", str(REPO / "configs" / "default.toml"), "hiden_dim=3"]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and "'hiden_dim'" in err
    assert "hidden_dim" in err  # the accepted keys are listed


# ------------------------------------------------- keys declared beside the code that reads them
def test_config_is_its_sections_and_the_models_keys():
    """The typed sections (an editor completes their fields) are the general keys, in the docs'
    order, and a section per model under its name; each is declared in a module of its concern,
    only the commands' own in settings."""
    general = [f.name for f in dataclasses.fields(settings.GeneralConfig)]
    assert sorted(general) == sorted(k.name for k in GENERAL_KEYS)
    kinds = set(settings.KIND_KEYS)  # a dataset kind's own keys, flat (images: cfg.image_size)
    assert kinds <= {f.name for f in dataclasses.fields(Config)} and not kinds & set(general)
    models = {
        f.name: f.type for f in dataclasses.fields(Config) if f.name not in [*general, *kinds]
    }
    assert models == {name: spec.keys for name, spec in MODELS.items() if spec.keys}
    assert models["mlp"] == MLPKeys and Config().mlp == MLPKeys()  # the GPT's: its own test
    homes = {section.__name__: section.__module__ for section in settings.SECTIONS}
    assert {name for name, home in homes.items() if home == settings.__name__} == {
        "RunKeys",
        "BenchmarkKeys",
    }
    assert homes["OptimizerKeys"].endswith(".optim")
    assert homes["DataKeys"].endswith(".data.batches")


def test_a_section_says_the_type_of_each_key():
    @dataclasses.dataclass
    class Wrong:
        steps: int = key("100", "a string default under an int annotation")

    with pytest.raises(TypeError, match="Wrong.steps is annotated int but its default '100'"):
        keys_of(Wrong)

    @dataclasses.dataclass
    class Right:
        steps: int = key(100, "steps", bounds=(1, 1000), resume=True)

    (declared,) = keys_of(Right)
    assert (declared.name, declared.type, declared.resume) == ("steps", int, True)
    with pytest.raises(ConfigError, match="'steps' must be in"):
        declared.parse("0")


def test_every_key_is_read_somewhere():
    """A declared key that no code reads would be a setting that does nothing."""
    source = "\n".join(p.read_text() for p in (REPO / "src").rglob("*.py"))
    unread = [name for name in settings.KEYS if not re.search(rf"\.{name}\b", source)]
    assert not unread, f"declared but never read (cfg.<key>): {unread}"


# ------------------------------------------------------------- the docs' table of config keys
DOCS = REPO / "docs" / "training.md"
BEGIN, END = "<!-- config keys: python tests/test_config.py rewrites this table -->", "<!-- end -->"


def test_docs_config_table_says_what_the_declarations_say():
    """Each key in the docs' table is described as declared, and every general key is there.
    A model you add needs no docs step: `python -m <package> keys` prints the table with every
    registered model's keys (`python tests/test_config.py` writes it into the docs)."""
    text = DOCS.read_text()
    documented = rows(text.split(BEGIN, 1)[1].split(END, 1)[0])
    declared = rows(docs_table())
    for name, row in documented.items():
        assert same_row(row, declared.get(name, "")), (
            f"{name}: docs/training.md is stale: run {__file__}"
        )
    assert {k.name for k in GENERAL_KEYS} <= set(documented)


def same_row(documented: str, declared: str) -> bool:
    """Equal, except that a list of choices may have grown since (`model`: your model added)."""
    old, new = documented.split("|"), declared.split("|")
    return len(old) == len(new) and all(
        a.strip() == b.strip() or set(a.strip().split(", ")) < set(b.strip().split(", "))
        for a, b in zip(old, new, strict=True)
    )


def rows(table: str) -> dict[str, str]:
    """A markdown table of keys, by key name (its first cell)."""
    lines = [line for line in table.strip().splitlines()[2:] if line.startswith("| `")]
    return {line.split("`", 2)[1]: line for line in lines}


if __name__ == "__main__":  # rewrite the table in docs/training.md
    head, rest = DOCS.read_text().split(BEGIN, 1)
    DOCS.write_text(f"{head}{BEGIN}\n{docs_table()}\n{END}{rest.split(END, 1)[1]}")


def test_a_hand_edited_config_toml_gives_one_answer_the_checkpoints(
    tmp_path, single_process, caplog, capsys
):
    """config.toml edited after the run wrote it: the checkpoint's record decides alone (one
    refusal or none, naming config.toml), not two refusals that contradict each other."""
    run = tmp_path / "run"
    args = [*TINY, f"run_dir={run}", "max_steps=4", "checkpoint_every=2", "eval_every=0"]
    assert main(args) == 0
    config = run / "config.toml"
    config.write_text(config.read_text().replace("lr = 0.01\n", "lr = 0.02\n"))
    capsys.readouterr()
    assert main(args) == 0  # the run's own values: it continues (here: already finished)
    said = caplog.text + capsys.readouterr().err  # the package's log goes to stderr
    assert f"{config} was edited after the run wrote it" in said and "config error" not in said
    assert "lr = 0.01\n" in config.read_text()  # rewritten by the run
    config.write_text(config.read_text().replace("lr = 0.01\n", "lr = 0.02\n"))
    assert main([*args, "lr=0.02"]) == 2  # the edited values: refused once, by the checkpoint
    err = capsys.readouterr().err
    assert err.count("config error") == 1 and "the checkpoint" in err and "lr: 0.01 -> 0.02" in err


def test_a_very_long_value_is_shown_cut_with_its_length():
    for item in ("max_steps=" + "9" * 400, "lr=" + "x" * 100_000, "device=" + "y" * 500):
        with pytest.raises(ConfigError) as err:
            load_config(None, [item])
        assert len(str(err.value)) < 300 and "characters)" in str(err.value), item
