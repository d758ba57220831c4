"""Config files with the GPT's keys: configs/tiny.toml and the experiments, its presets merged in
order and through `extends`, in any spelling (test_config_files.py: the same on the classifier)."""

import pytest
from conftest import REPO
from test_config_files import write

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config.settings import Config, ConfigError, load_config, to_toml


def test_gpt_config_files_merge_in_order(tmp_path):
    first = write(tmp_path / "a.toml", 'preset = "tiny"\nmax_steps = 40\nlr = 0.001\n')
    second = write(tmp_path / "b.toml", "max_steps = 7\n")
    cfg, origins = load_config([first, second], ["lr=0.5"])
    assert (cfg.gpt.preset, cfg.max_steps, cfg.lr) == ("tiny", 7, 0.5)  # b over a, overrides last
    assert origins == {"preset": str(first), "max_steps": str(second), "lr": "command line"}
    assert load_config([second, first]).config.max_steps == 40  # the order decides


def test_a_gpt_config_extends_relative_to_the_file_and_the_file_wins(tmp_path):
    write(tmp_path / "base.toml", 'preset = "tiny"\nbatch_size = 8\nlr = 0.003\n')
    write(tmp_path / "mid" / "middle.toml", 'extends = "../base.toml"\nbatch_size = 4\n')
    leaf = write(tmp_path / "mid" / "deep" / "exp.toml", 'extends = "../middle.toml"\nlr = 0.1\n')
    cfg, _ = load_config(leaf)
    assert (cfg.gpt.preset, cfg.batch_size, cfg.lr) == ("tiny", 4, 0.1)


def test_the_example_experiment_is_tiny_plus_its_differences():
    experiment = REPO / "configs" / "experiments" / "tiny-wide.toml"
    cfg, _ = load_config(experiment)
    tiny, _ = load_config(REPO / "configs" / "tiny.toml")
    changed = {k for k, v in vars(cfg).items() if getattr(tiny, k) != v}
    assert changed == {"gpt", "lr", "max_steps"}
    changed_own = {k for k, v in vars(cfg.gpt).items() if getattr(tiny.gpt, k) != v}
    assert changed_own == {"n_embd"}
    assert cfg.gpt.preset == "tiny" and cfg != Config()


def test_the_finetune_example_is_gpt2s_architecture():
    cfg, _ = load_config(REPO / "configs" / "experiments" / "finetune-gpt2.toml")
    assert (cfg.gpt.bias, cfg.gpt.gelu, cfg.gpt.preset, cfg.init_from) == (
        True,
        "tanh",
        "gpt2-124m",
        "models/gpt2",
    )


def test_the_tiny_config_trains_a_second_model(tmp_path, single_process):
    """configs/tiny.toml keeps the GPT's own keys in [gpt]: they apply only to the GPT, so the
    same file trains model=mlp (it was refused: "preset belongs to model gpt")."""
    tiny = REPO / "configs" / "tiny.toml"
    assert load_config(tiny).config.gpt.preset == "tiny"
    mlp, _ = load_config(tiny, ["model=mlp"])
    assert (mlp.model, mlp.gpt.preset, mlp.batch_size) == ("mlp", Config().gpt.preset, 8)
    run = ["--config", str(tiny), "model=mlp", "dataset=synthetic", "device=cpu", "max_steps=2"]
    assert main([*run, f"run_dir={tmp_path / 'mlp'}"]) == 0


def test_the_gpts_table_merges_and_yields_to_later_sources(tmp_path):
    write(tmp_path / "base.toml", 'lr = 0.003\n[gpt]\npreset = "tiny"\nn_embd = 32\n')
    child = write(tmp_path / "child.toml", 'extends = "base.toml"\n[gpt]\nn_embd = 48\n')
    cfg, _ = load_config(child)
    assert (cfg.gpt.preset, cfg.gpt.n_embd, cfg.lr) == ("tiny", 48, 0.003)  # merged, child wins
    later = write(tmp_path / "later.toml", "n_embd = 16\n")
    assert load_config([child, later]).config.gpt.n_embd == 16  # a later file's plain key
    assert load_config(child, ["n_embd=64"]).config.gpt.n_embd == 64  # the command line
    assert load_config(child, ["gpt.n_embd=80"]).config.gpt.n_embd == 80  # the table's spelling
    mlp, _ = load_config(child, ["model=mlp"])
    assert mlp.gpt == Config().gpt  # not the GPT: its table is ignored


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[nosuch]\nx = 1\n", r"table \[nosuch\] is not a model; models: gpt, mlp"),
        (
            "[mlp]\npreset = 'tiny'\n",
            r"\[mlp\] 'preset' is not a key of model mlp; its keys: hidden_dim",
        ),
        ("[gpt]\nlr = 0.1\n", r"\[gpt\] 'lr' is not a key of model gpt"),
    ],
)
def test_a_wrong_gpt_table_is_one_line_naming_the_file(tmp_path, text, message):
    path = write(tmp_path / "c.toml", text)
    with pytest.raises(ConfigError, match=f"config file {path}: {message}"):
        load_config(path)


@pytest.mark.parametrize(
    "base_spelling",
    ['preset = "tiny"\n', 'gpt.preset = "tiny"\n', '[gpt]\npreset = "tiny"\n'],
    ids=["flat", "dotted", "table"],
)
@pytest.mark.parametrize(
    "own_spelling",
    ['preset = "gpt2-124m"\n', '[gpt]\npreset = "gpt2-124m"\n'],
    ids=["own", "own-table"],
)
def test_a_files_own_gpt_key_beats_its_bases_in_any_spelling(tmp_path, base_spelling, own_spelling):
    """`extends` a file with `[gpt] preset = "tiny"` and say `preset = "gpt2-124m"`: the file's
    own key wins (it trained gpt:tiny, and config.toml's origins credited the extending file);
    the two files as two --config give the same."""
    base = write(tmp_path / "configs" / "tiny.toml", f"lr = 0.003\n{base_spelling}")
    own = write(
        tmp_path / "configs" / "exp" / "big.toml", f'extends = "../tiny.toml"\n{own_spelling}'
    )
    cfg, origins = load_config(own)
    assert cfg.gpt.preset == "gpt2-124m" and cfg.lr == 0.003
    assert origins == {"lr": str(base), "preset": str(own)}  # each value's own file
    assert load_config([base, own]).config == cfg
    assert load_config([own, base]).config.gpt.preset == "tiny"  # the later file wins


def test_the_repositorys_tiny_toml_extended_with_a_preset_trains_it(tmp_path):
    tiny = REPO / "configs" / "tiny.toml"
    own = write(tmp_path / "big.toml", f'extends = "{tiny}"\npreset = "gpt2-124m"\n')
    cfg, origins = load_config(own)
    assert (cfg.gpt.preset, cfg.batch_size, origins["preset"]) == ("gpt2-124m", 8, str(own))
    assert origins["batch_size"] == str(tiny)


def test_one_source_giving_a_gpt_key_plainly_and_in_its_table_is_refused(tmp_path):
    """Inside one file, or the command line: the plain key and the model's table with different
    values is one line naming both spellings (the table won silently); equal values pass."""
    both = write(tmp_path / "both.toml", 'preset = "gpt2-124m"\n[gpt]\npreset = "tiny"\n')
    message = r"'preset' is set twice, as preset = 'gpt2-124m' and as gpt.preset = 'tiny'; keep one"
    with pytest.raises(ConfigError, match=f"config file {both}: {message}"):
        load_config(both)
    with pytest.raises(
        ConfigError,
        match="command line: 'preset' is set twice, as preset=gpt2-124m and as gpt.preset=tiny",
    ):
        load_config(None, ["preset=gpt2-124m", "gpt.preset=tiny"])
    same = write(tmp_path / "same.toml", 'preset = "tiny"\n[gpt]\npreset = "tiny"\n')
    assert load_config(same).config.gpt.preset == "tiny"
    assert load_config(None, ["preset=tiny", "preset=gpt2-124m"]).config.gpt.preset == "gpt2-124m"
    # a later source in either spelling overrides an earlier one in the other
    assert (
        load_config(both.with_name("same.toml"), ["gpt.preset=gpt2-350m"]).config.gpt.preset
        == "gpt2-350m"
    )


def test_vocab_size_is_not_recorded_for_a_model_that_does_not_read_it(tmp_path, caplog):
    """configs/tiny.toml's vocab_size = 256 sizes the GPT and synthetic tokens; model=hf on a
    dataset directory (or model=mlp) reads it nowhere: left at its default, with a line,
    instead of recorded in config.toml as if used."""
    transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")
    transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=512, max_position_embeddings=64,
    ).save_pretrained(tmp_path / "llama")  # fmt: skip
    tiny = REPO / "configs" / "tiny.toml"
    hf = ["model=hf", f"hf_model={tmp_path / 'llama'}", "hf_weights=random", "hf_context_length=64"]
    cfg, origins = load_config(tiny, [*hf, f"dataset={tmp_path}"])
    assert cfg.vocab_size == Config().vocab_size and "vocab_size" not in origins
    assert "vocab_size = 0\n" in to_toml(cfg)
    assert f"vocab_size=256 (from {tiny}) is not read by model=hf with dataset={tmp_path}" in (
        caplog.text
    )
    assert load_config(tiny, hf).config.vocab_size == 256  # synthetic tokens read it
    assert load_config(tiny, [f"dataset={tmp_path}"]).config.vocab_size == 256  # the GPT's
    assert load_config(tiny, ["model=mlp"]).config.vocab_size == Config().vocab_size
