"""A run's start, as checkpoint/start.py decided it: the ranks agree on the config and the data,
the data is checked in full, the newest good checkpoint loads (a resume, refused when the config
or the data changed) or the new run's initial weights do; then the run is recorded in its
checkpoints and config.toml."""

from __future__ import annotations

import dataclasses
import logging
import os

import torch

from .. import checkpoint, distributed
from ..checkpoint import adapters
from ..checkpoint.start import Start, load_start
from ..config.resume import check_resume, check_run_dir_config
from ..config.settings import Config, ConfigError, config_record, save_config
from ..data.kinds import verify_files
from ..distributed import DistEnv
from ..run.rundir import RunDir, reported
from .build import Run
from .epochs import settle_length

log = logging.getLogger(__name__.split(".")[0])


def check_ranks_agree(what: str, values: dict) -> None:
    """Every rank's `values` equal rank 0's, or every rank stops with one line naming the first
    rank that differs and its keys (ranks given different arguments would train on silently,
    write a checkpoint none can load, or hang in a collective)."""
    gathered = distributed.all_gather_object(values)
    for rank, other in enumerate(gathered):
        keys = sorted(k for k in values if other.get(k) != gathered[0].get(k))
        if keys:
            shown = "; ".join(f"{k}: {gathered[0].get(k)!r} vs {other.get(k)!r}" for k in keys[:5])
            raise ConfigError(
                f"rank {rank}'s {what} differs from rank 0's ({shown}): every rank must run the "
                "same run; check the arguments the launcher gives each rank"
            )


def check_unchanged(cfg: Config, env: DistEnv) -> None:
    """Before DCP reads anything: a changed model or resume-relevant key on a run directory with
    checkpoints is refused with the list of changes (rank 0 reads, every rank learns it)."""
    error = None
    if env.is_main:
        run_dir = RunDir(cfg.run_dir)
        try:
            has_checkpoints = bool(checkpoint.complete_steps(run_dir.checkpoints))
            check_run_dir_config(cfg, run_dir, has_checkpoints)
        except ConfigError as err:
            error = str(err)
    error = distributed.broadcast_object(error)
    if error:
        raise ConfigError(error)


def resume(run: Run, ckpt: checkpoint.CheckpointManager, start: Start) -> None:
    """Load the run's start (`start`, checkpoint.start.open_start's): the newest good checkpoint,
    refused when it is from a different run, or a new run's initial weights; a LoRA run's base
    under either."""
    check_ranks_agree("dataset", {"fingerprint": run.source.info.fingerprint})
    verify_files(run.source, run.env.rank, run.env.world_size)  # every shard, read in full
    check_unchanged(run.cfg, run.env)
    step, loaded, memory = load_start(start, run.model, run.spec, run.cfg, run.source.info, ckpt)
    run.memory |= memory
    if step is None and loaded is not None:
        run.state.extra["init_from"] = loaded  # recorded in every checkpoint of the run
        log.info(
            "starting a new run in %s from the weights of %s (this rank's host memory: %.2f "
            "GiB before the build, peak %.2f GiB after loading; the weights: %.2f GiB)",
            *(run.cfg.run_dir, loaded),
            *(run.memory[k] for k in ("rss_before_build_gib", "peak_rss_gib", "model_gib")),
        )
        return
    if step is None:
        log.info("starting a new run in %s", run.cfg.run_dir)
        return
    if loaded is not None:
        log.info("LoRA: the frozen base from %s, the adapters from the checkpoint", loaded)
    extra = run.state.extra
    check_resume(
        extra["config"],
        run.cfg,
        extra["world_size"],
        run.env.world_size,
        extra.get("data_fingerprint"),
        run.source.info.fingerprint,
    )
    log.warning(
        "RESUMING %s from checkpoint step %d (written by torch %s, commit %s)",
        *(run.cfg.run_dir, step, extra.get("torch_version"), extra.get("git_commit")),
    )


def open_checkpoints(
    run: Run, start: Start, origins: dict[str, str] | None
) -> checkpoint.CheckpointManager:
    """The run's checkpoints with its start loaded (the newest good one, or a new run's weights),
    its length settled (`epochs`), and the run recorded in them and in config.toml (with where
    its values came from: `origins`, load_config's)."""
    cfg, env, run_dir = run.cfg, run.env, RunDir(run.cfg.run_dir)
    ckpt = checkpoint.CheckpointManager(
        run_dir.checkpoints,
        run.checkpoint_parts(),
        keep=cfg.keep_checkpoints,
        async_save=cfg.async_checkpoint == "true"
        or (cfg.async_checkpoint == "auto" and run.device.type == "cuda"),
        timeout_s=cfg.dist_timeout_s,  # a node lost during a save: the same wait as in training
    )
    resume(run, ckpt, start)
    cfg = settle_length(run)  # epochs=N: the run's steps, from its step and data position
    # the dataset recorded as an absolute path: evaluate and generate find it from any directory
    where = cfg.dataset if cfg.dataset == "synthetic" else os.path.abspath(cfg.dataset)
    recorded = dataclasses.replace(cfg, dataset=where)
    adapters.record_base(run.state.extra, cfg)  # an adapter's base, in every checkpoint
    run.state.extra.update(
        # data_info: what `generate` and `export` need to rebuild the model without the data
        config=config_record(recorded) | {"data_info": dataclasses.asdict(run.source.info)},
        world_size=env.world_size,
        data_fingerprint=run.source.info.fingerprint,
        git_commit=checkpoint.git_commit(),
        torch_version=str(torch.__version__),
    )
    if env.is_main:
        with reported(f"cannot write {run_dir.config}"):
            save_config(recorded, run_dir.config, origins)
    return ckpt
