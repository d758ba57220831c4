"""DDP training package: `python -m` this package to train, benchmark, make a dataset or plot.

Modules, one concern each:

- `config`      the `Config` dataclass, TOML + `key=value` overrides
- `distributed` ranks from torchrun/Slurm, device, process group, per-rank logging
- `data`        synthetic and memmap datasets, resumable sampler, loaders
- `model`       the example model and its loss (replace it here)
- `train`       the training loop
- `metrics`     throughput/MFU/memory records, `metrics.jsonl`, plots
- `checkpoint`  atomic full-state checkpoints, automatic resume
- `preemption`  SIGUSR2/SIGTERM flag, agreement across ranks, requeue exit code
- `benchmark`   training step vs. bare loop
"""

__version__ = "0.1.0"
