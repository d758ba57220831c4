"""Training package: `python -m` this package to train, benchmark, check a node, make a dataset,
sample, export or plot.

Modules, one concern each:

- `config`       the `Config` dataclass, TOML + `key=value` overrides
- `distributed`  ranks from torchrun/Slurm, device, process group, per-rank logging
- `data`         batches as a function of the step; MLP arrays; where batches are prepared
- `tokens`       token shards for language models (make-dataset), byte-level tokenizer
- `prefetch`     the next batches copied to the GPU on a side stream while a step runs
- `model`        which model a run trains, its loss and FLOPs (add yours here)
- `gpt`          the GPT-2 style language model and sampling
- `parallel`     DDP or FSDP2, activation checkpointing, torch.compile
- `train`        the training loop
- `checkpoint`   sharded (DCP) checkpoints: parts, manager, integrity checks, export
- `preemption`   SIGUSR2/SIGTERM flag, the stop/save decision, checkpoint interval, requeue
- `rundir`       the run directory's paths (`RunDir`), one-line I/O errors
- `rundir_lock`  one live job per run directory
- `atomic`       files written complete or not at all
- `metrics`      throughput/MFU/memory records, `metrics.jsonl`, plots
- `tracking`     optional TensorBoard / W&B sinks
- `doctor`       preflight checks of a node's environment and all-reduce bandwidth
- `benchmark`    training step vs. a bare loop
- `generate`     text from a checkpoint
"""

__version__ = "0.1.0"
