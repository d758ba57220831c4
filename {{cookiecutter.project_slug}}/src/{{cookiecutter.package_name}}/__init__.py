"""Training package: `python -m` this package to train, benchmark, check a node, make a dataset,
sample, export or plot.

One folder per concern: `config/` (the keys of a run), `data/` (reading datasets: the kinds,
add yours there), `models/` (add yours there), `checkpoint/`, `training/` (the step and the
loop), `make_dataset/` (writing datasets), `run/` (the run directory, preemption),
`telemetry/` (what a run reports), `doctor/` (preflight checks) and `commands/` (one module per
command, and their table); at the top, the command line's front door (`__main__`, `cli`) and the
modules everything uses (`config_keys`, `distributed`, `parallel`, `optim`). Imports run one
way, down the layers listed with the module map, one line per module, in docs/training.md.
"""

__version__ = "0.1.0"
