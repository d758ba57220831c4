"""Training package: `python -m` this package to train, benchmark, check a node, make a dataset,
sample, export or plot.

One folder per concern: `config/` (the keys of a run), `data/` (the kinds of dataset: add yours
there), `models/` (add yours there), `checkpoint/`, `run/` (the run directory, preemption),
`telemetry/` (what a run reports) and `doctor/` (preflight checks); at the top, the commands
(`commands` is their table; `cli`, `train`, `benchmark`, `generate`, `evaluate`) and the modules
everything uses (`config_keys`, `distributed`, `parallel`, `optim`). Imports run one way, down
the layers listed with the module map, one line per module, in docs/training.md.
"""

__version__ = "0.1.0"
