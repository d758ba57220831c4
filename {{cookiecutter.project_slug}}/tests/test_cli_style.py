"""One argument style: `run_dir=DIR` for every subcommand, options and key=value in any order."""

import argparse

import pytest

from {{ cookiecutter.package_name }} import cli
from {{ cookiecutter.package_name }}.commands import parse


@pytest.mark.parametrize(
    ("argv", "dest"),
    [
        (["export", "--out", "m.pt", "run_dir=runs/a"], "run"),
        (["export", "run_dir=runs/a", "--out", "m.pt"], "run"),
        (["plot", "run_dir=runs/a", "--out", "p.png"], "path"),
    ],
)
def test_every_command_takes_run_dir_key_value_anywhere(argv, dest, capsys):
    """generate's: test_generate.py."""
    assert getattr(parse(argv), dest).as_posix() == "runs/a"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["plot", "runs/a"],
        ["export", "runs/a", "--out", "m.pt"],
        ["export", "run_dir=", "--out", "m.pt"],
        ["train", "--run-dir", "runs/a"],
    ],
)
def test_one_spelling_only(argv, capsys):
    """The template has no earlier release to stay compatible with: no second spelling."""
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "run_dir=DIR" in err or "unrecognized arguments: --run-dir" in err


def test_plot_of_a_metrics_file(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("")
    assert parse(["plot", str(metrics)]).path == metrics
    assert capsys.readouterr().err == ""


def test_doctor_directories_reach_its_parser():
    args = parse(["doctor", "--quick", "run_dir=runs/a", "data_dir=data/x"])
    assert args.argv == ["--quick", "--run-dir", "runs/a", "--data-dir", "data/x"]
    from {{ cookiecutter.package_name }}.doctor.preflight import make_parser

    checked = make_parser().parse_args(args.argv)
    assert str(checked.run_dir) == "runs/a" and str(checked.data_dir) == "data/x"


def test_doctor_run_dir_reaches_the_checks(tmp_path, monkeypatch, capsys):
    """`doctor run_dir=FILE` (a file where the run directory belongs) fails that check."""
    import {{ cookiecutter.package_name }}.doctor.preflight as doctor

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
