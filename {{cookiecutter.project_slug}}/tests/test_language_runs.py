"""The GPT's cases of the shared tests (those run on conftest.py's TINY, the classifier every
training workload keeps): what only a language model has, its token windows, its presets and
sizes, its vocabulary and the tokens its lines count."""

from _language import TINY_GPT
from conftest import TINY

from {{ cookiecutter.package_name }}.cli import main


def test_epochs_on_token_windows_are_refused_in_one_line(tmp_path, single_process, capsys):
    """Token windows are drawn at random positions: no passes to count."""
    tiny = [item for item in TINY_GPT if not item.startswith("max_steps=")]
    argv = [*tiny, f"run_dir={tmp_path / 'run'}", "epochs=2", "eval_every=1epoch"]
    assert main(argv) == 2
    err = capsys.readouterr().err  # refused once the data is open: after the start's lines
    assert "Traceback" not in err and "epochs need a dataset of samples" in err.splitlines()[-1]
    assert "epochs=2, eval_every=1epoch: " in err.splitlines()[-1]
    assert not (tmp_path / "run").exists()  # nothing half-written


def test_another_model_or_size_on_a_gpt_run_is_refused_before_loading(
    tmp_path, single_process, capsys
):
    """Exit 2, one line with each changed key and the two ways on; no checkpoint is read (a
    GPT checkpoint loaded into another shape would end in DCP's size-mismatch text)."""
    run_dir = tmp_path / "run"
    argv = [*TINY_GPT, f"run_dir={run_dir}", "max_steps=2", "checkpoint_every=2", "eval_every=0"]
    assert main(argv) == 0

    def files() -> dict:  # every file's time and size (folders change: the lock, write probes)
        return {
            p: (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*") if p.is_file()
        }

    before = files()
    for changed, shown in [
        ([*argv, "n_layer=3", "n_head=4"], "n_layer: 0 -> 3; n_head: 0 -> 4"),
        ([*argv, "preset=gpt2-124m", "n_embd=0", "block_size=0"], "preset: 'tiny' -> 'gpt2-124m'"),
        ([*TINY, f"run_dir={run_dir}", "max_steps=2"], "model: 'gpt' -> 'mlp'"),
    ]:
        capsys.readouterr()
        assert main(changed) == 2
        err = capsys.readouterr().err
        (line,) = [line for line in err.splitlines() if "error" in line]
        assert shown in line and "new run_dir" in line and "restore the values" in line
        assert "Traceback" not in err and "mismatch" not in err.lower()
    assert files() == before  # no file of the run was touched
