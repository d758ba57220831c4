"""One argument style: `run_dir=DIR` for every subcommand; the older spellings still work."""

import argparse

import pytest

from {{ cookiecutter.package_name }} import arguments, cli


def parse(argv):
    return arguments.parse(cli.make_parser(), argv)


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["generate", "run_dir=runs/a", "--tokens", "5"], "run", "run_dir=runs/a"),
        (["generate", "--tokens", "5", "run_dir=runs/a"], "run", "run_dir=runs/a"),
        (["export", "--out", "m.pt", "run_dir=runs/a"], "run", "run_dir=runs/a"),
        (["export", "run_dir=runs/a", "--out", "m.pt"], "run", "run_dir=runs/a"),
        (["plot", "run_dir=runs/a", "--out", "p.png"], "path", "run_dir=runs/a"),
    ],
)
def test_every_command_takes_run_dir_key_value_anywhere(argv, dest, value, capsys):
    args = parse(argv)
    assert getattr(args, dest) == value
    assert cli.run_dir_argument(getattr(args, dest)).as_posix() == "runs/a"
    assert capsys.readouterr().err == ""  # the documented form: no note


@pytest.mark.parametrize(
    ("argv", "dest", "old"),
    [
        (["plot", "runs/a"], "path", "plot runs/a"),
        (["generate", "runs/a", "--tokens", "5"], "run", "generate runs/a"),
        (["export", "runs/a", "--out", "m.pt"], "run", "export runs/a"),
    ],
)
def test_old_positional_spellings_are_accepted_with_a_note(argv, dest, old, capsys):
    args = parse(argv)
    assert cli.run_dir_argument(getattr(args, dest)).as_posix() == "runs/a"
    err = capsys.readouterr().err
    assert f"`{old}` is the old spelling" in err and f"run_dir={old.split()[-1]}" in err


def test_plot_of_a_metrics_file_needs_no_note(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("")
    assert parse(["plot", str(metrics)]).path == str(metrics)
    assert capsys.readouterr().err == ""


def test_run_dir_option_is_an_alias_everywhere(capsys):
    assert parse(["train", "--run-dir", "runs/a", "max_steps=3"]).overrides == [
        "run_dir=runs/a",
        "max_steps=3",
    ]
    assert parse(["export", "--run-dir=runs/a", "--out", "m.pt"]).run == "run_dir=runs/a"
    assert "`train --run-dir runs/a` is the old spelling" in capsys.readouterr().err


def test_doctor_takes_both_spellings(capsys):
    new = parse(["doctor", "--quick", "run_dir=runs/a", "data_dir=data/x"])
    old = parse(["doctor", "--run-dir", "runs/a", "--quick", "--data-dir", "data/x"])
    expected = ["--quick", "--run-dir", "runs/a", "--data-dir", "data/x"]
    assert new.doctor_argv == expected
    assert sorted(old.doctor_argv) == sorted(expected)
    err = capsys.readouterr().err
    assert err.count("old spelling") == 2 and "use `doctor run_dir=runs/a`" in err
    from {{ cookiecutter.package_name }}.doctor import make_parser

    checked = make_parser().parse_args(new.doctor_argv)
    assert str(checked.run_dir) == "runs/a" and str(checked.data_dir) == "data/x"


def test_doctor_run_dir_reaches_the_checks(tmp_path, monkeypatch, capsys):
    """`doctor run_dir=FILE` (a file where the run directory belongs) fails that check."""
    import {{ cookiecutter.package_name }}.doctor as doctor

    seen = {}

    def fake_main(argv):
        seen["args"] = doctor.make_parser().parse_args(argv)
        return 0

    monkeypatch.setattr(doctor, "main", fake_main)
    assert cli.main(["doctor", "--quick", f"run_dir={tmp_path}"]) == 0
    assert seen["args"].run_dir == tmp_path and seen["args"].quick


def test_train_options_and_overrides_in_any_order():
    args = parse(["train", "run_dir=x", "--config", "c.toml", "dataset=y", "--config", "d.toml"])
    assert [str(p) for p in args.config] == ["c.toml", "d.toml"]
    assert args.overrides == ["run_dir=x", "dataset=y"]
    bench = parse(["benchmark", "max_steps=3", "--size", "large", "run_dir=z"])
    assert bench.size == "large" and bench.overrides == ["max_steps=3", "run_dir=z"]
    assert isinstance(args, argparse.Namespace) and args.command == "train"
