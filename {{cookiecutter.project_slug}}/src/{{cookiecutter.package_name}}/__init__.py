"""Training package: `python -m` this package to train, benchmark, check a node, make a dataset,
sample, export or plot.

One folder per concern: `config/` (the keys of a run), `data/`, `models/` (add yours there),
`checkpoint/`, `run/` (the run directory, preemption), `telemetry/` (what a run reports) and
`doctor/` (preflight checks); the commands (`cli`, `train`, `benchmark`, `generate`) and the
modules everything uses (`distributed`, `parallel`, `config_keys`) at the top. The module map,
one line per module: docs/training.md.
"""

__version__ = "0.1.0"
