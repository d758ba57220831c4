"""Config files: several --config merged in order, `extends`, and options mixed with key=value;
a model's keys in its table or plain (the classifier's here; the GPT's: test_config_files_gpt.py).
"""

import pytest
from conftest import TINY

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config.settings import ConfigError, load_config


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_config_files_merge_in_order(tmp_path):
    first = write(tmp_path / "a.toml", "seed = 3\nmax_steps = 40\nlr = 0.001\n")
    second = write(tmp_path / "b.toml", "max_steps = 7\n")
    cfg, origins = load_config([first, second], ["lr=0.5"])
    assert (cfg.seed, cfg.max_steps, cfg.lr) == (3, 7, 0.5)  # b over a, overrides last
    assert origins == {"seed": str(first), "max_steps": str(second), "lr": "command line"}
    assert load_config([second, first]).config.max_steps == 40  # the order decides


def test_extends_is_relative_to_the_file_and_the_file_wins(tmp_path):
    write(tmp_path / "base.toml", "seed = 3\nbatch_size = 8\nlr = 0.003\n")
    write(tmp_path / "mid" / "middle.toml", 'extends = "../base.toml"\nbatch_size = 4\n')
    leaf = write(tmp_path / "mid" / "deep" / "exp.toml", 'extends = "../middle.toml"\nlr = 0.1\n')
    cfg, _ = load_config(leaf)
    assert (cfg.seed, cfg.batch_size, cfg.lr) == (3, 4, 0.1)


def test_extends_cycle_and_missing_base_are_one_line_errors(tmp_path):
    a = write(tmp_path / "a.toml", 'extends = "b.toml"\n')
    write(tmp_path / "b.toml", 'extends = "a.toml"\n')
    with pytest.raises(ConfigError, match="extends forms a cycle") as err:
        load_config(a)
    assert "\n" not in str(err.value)
    self_ref = write(tmp_path / "self.toml", 'extends = "self.toml"\n')
    with pytest.raises(ConfigError, match="cycle"):
        load_config(self_ref)
    missing = write(tmp_path / "c.toml", 'extends = "nowhere.toml"\n')
    with pytest.raises(ConfigError, match=r"extends 'nowhere.toml', but .*nowhere.toml is not"):
        load_config(missing)
    bad_key = write(tmp_path / "d.toml", 'extends = "e.toml"\n')
    write(tmp_path / "e.toml", "max_step = 3\n")
    with pytest.raises(ConfigError, match=r"config file .*e.toml: unknown config key 'max_step'"):
        load_config(bad_key)


def test_cli_reports_a_cycle_in_one_line_with_status_2(tmp_path, capsys):
    a = write(tmp_path / "a.toml", 'extends = "a.toml"\n')
    assert main(["train", "--config", str(a)]) == 2
    err = capsys.readouterr().err.strip()
    assert "extends forms a cycle" in err and len(err.splitlines()) == 1


def test_repeated_config_and_mixed_order_train_and_record_the_resolved_config(
    tmp_path, single_process
):
    base = write(tmp_path / "base.toml", "max_steps = 50\nlog_every = 1\nlr = 0.002\n")
    change = write(tmp_path / "exp.toml", 'extends = "base.toml"\nmax_steps = 2\n')
    run_dir = tmp_path / "run"
    short = [item for item in TINY if not item.startswith("max_steps=")]
    # options and key=value in any order: key=value before, between and after the --config
    argv = ["train", f"run_dir={run_dir}", "--config", str(base), *short]
    argv += ["--config", str(change), "checkpoint_every=0"]
    assert main(argv) == 0
    recorded, _ = load_config(run_dir / "config.toml")
    assert recorded.max_steps == 2 and recorded.lr == 0.01  # exp.toml over base.toml, then TINY
    assert recorded.checkpoint_every == "0" and recorded.run_dir == str(run_dir)


def test_model_tables_merge_and_yield_to_later_sources(tmp_path):
    write(tmp_path / "base.toml", 'model = "mlp"\nlr = 0.003\n[mlp]\nhidden_dim = 32\n')
    child = write(tmp_path / "child.toml", 'extends = "base.toml"\n[mlp]\nhidden_dim = 48\n')
    cfg, _ = load_config(child)
    assert (cfg.model, cfg.mlp.hidden_dim, cfg.lr) == ("mlp", 48, 0.003)  # merged, child wins
    later = write(tmp_path / "later.toml", "hidden_dim = 16\n")
    assert load_config([child, later]).config.mlp.hidden_dim == 16  # a later file's plain key
    assert load_config(child, ["hidden_dim=64"]).config.mlp.hidden_dim == 64  # the command line
    assert load_config(child, ["mlp.hidden_dim=80"]).config.mlp.hidden_dim == 80  # the table's


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[nosuch]\nx = 1\n", r"table \[nosuch\] is not a model; models: (.+, )?mlp"),
        (
            "[mlp]\npreset = 'tiny'\n",
            r"\[mlp\] 'preset' is not a key of model mlp; its keys: hidden_dim",
        ),
        ("[mlp]\nlr = 0.1\n", r"\[mlp\] 'lr' is not a key of model mlp"),
    ],
)
def test_a_wrong_model_table_is_one_line_naming_the_file(tmp_path, text, message):
    path = write(tmp_path / "c.toml", text)
    with pytest.raises(ConfigError, match=f"config file {path}: {message}"):
        load_config(path)


@pytest.mark.parametrize(
    "base_spelling",
    ["hidden_dim = 32\n", "mlp.hidden_dim = 32\n", "[mlp]\nhidden_dim = 32\n"],
    ids=["flat", "dotted", "table"],
)
@pytest.mark.parametrize(
    "own_spelling", ["hidden_dim = 64\n", "[mlp]\nhidden_dim = 64\n"], ids=["own", "own-table"]
)
def test_a_files_own_key_beats_its_bases_in_any_spelling(tmp_path, base_spelling, own_spelling):
    """`extends` a file with `[mlp] hidden_dim = 32` and say `hidden_dim = 64`: the file's own
    key wins (config.toml's origins credit the extending file); the two files as two --config
    give the same."""
    base = write(tmp_path / "configs" / "small.toml", f'model = "mlp"\nlr = 0.003\n{base_spelling}')
    own = write(
        tmp_path / "configs" / "exp" / "wide.toml", f'extends = "../small.toml"\n{own_spelling}'
    )
    cfg, origins = load_config(own)
    assert cfg.mlp.hidden_dim == 64 and cfg.lr == 0.003
    assert origins == {"model": str(base), "lr": str(base), "hidden_dim": str(own)}
    assert load_config([base, own]).config == cfg
    assert load_config([own, base]).config.mlp.hidden_dim == 32  # the later file wins


def test_one_source_giving_a_key_plainly_and_in_its_table_is_refused(tmp_path):
    """Inside one file, or the command line: the plain key and the model's table with different
    values is one line naming both spellings (the table won silently); equal values pass."""
    both = write(tmp_path / "both.toml", 'model = "mlp"\nhidden_dim = 64\n[mlp]\nhidden_dim = 32\n')
    message = r"'hidden_dim' is set twice, as hidden_dim = 64 and as mlp.hidden_dim = 32; keep one"
    with pytest.raises(ConfigError, match=f"config file {both}: {message}"):
        load_config(both)
    with pytest.raises(
        ConfigError,
        match="command line: 'hidden_dim' is set twice, as hidden_dim=64 and as mlp.hidden_dim=32",
    ):
        load_config(None, ["model=mlp", "hidden_dim=64", "mlp.hidden_dim=32"])
    same = write(tmp_path / "same.toml", 'model = "mlp"\nhidden_dim = 32\n[mlp]\nhidden_dim = 32\n')
    assert load_config(same).config.mlp.hidden_dim == 32
    twice = ["model=mlp", "hidden_dim=32", "hidden_dim=64"]
    assert load_config(None, twice).config.mlp.hidden_dim == 64
    # a later source in either spelling overrides an earlier one in the other
    assert load_config(same, ["mlp.hidden_dim=80"]).config.mlp.hidden_dim == 80
