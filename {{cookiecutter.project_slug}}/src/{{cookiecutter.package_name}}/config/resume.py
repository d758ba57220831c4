"""Whether a run may continue: a run directory's config.toml and a checkpoint's record of its
config, compared with the config of the start that wants to continue them. A key declared with
`resume=True` (the model's shape, the data order, the optimizer, the schedule) must be unchanged,
unless force_resume=true; a different world size is allowed (checkpoints reshard).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..config_keys import ConfigError, read_toml
from ..models import MODELS
from ..run.rundir import RunDir
from .settings import FLAT, OWN_KEYS, Config, edited_by_hand

log = logging.getLogger(__name__.split(".")[0])


def changed_keys(saved: dict, cfg: Config, same_data: bool = False) -> list[str]:
    """`key: old -> new` for each resume-relevant key that differs between a run's record
    (config_record's form) and `cfg`: the general keys, the model's own (in its table), and when
    the model changed the old model's as well. `same_data`: the dataset is the same whatever its
    path's spelling."""
    # a key the record lacks was written before the key existed: its default applied. With
    # epochs set, max_steps is the run's length that training/epochs.py worked out from them
    # at its start (recorded), not a key of its own: the epochs are compared.
    pairs = [
        (k.name, saved.get(k.name, k.default), getattr(cfg, k.name))
        for k in FLAT.values()
        if k.resume and not (k.name == "max_steps" and cfg.epochs)
    ]
    models = [cfg.model]
    if saved.get("model") in MODELS and saved["model"] != cfg.model:
        models.append(saved["model"])
    for model in models:
        section, recorded = getattr(cfg, model, None), saved.get(model)
        for own in (k for k in OWN_KEYS.get(model, ()) if k.resume):
            # a record holds its own model's table only: another model's keys were at defaults
            old = recorded.get(own.name) if isinstance(recorded, dict) else own.default
            pairs.append((own.name, old, getattr(section, own.name)))
    return [
        f"{key}: {old!r} -> {new!r}"
        for key, old, new in pairs
        if old != new and not (key == "dataset" and same_data)
    ]


def refuse_or_warn(changed: list[str], cfg: Config, what: str) -> None:
    if not changed:
        return
    message = f"{what} was written with a different configuration: " + "; ".join(changed)
    if not cfg.force_resume:
        raise ConfigError(
            f"{message}. Either use a new run_dir, or restore the values to continue this run "
            "(force_resume=true continues anyway)."
        )
    log.warning(
        "force_resume=true overrides %d resume check(s) of %s: %s",
        len(changed),
        what,
        "; ".join(changed),
    )


def check_run_dir_config(cfg: Config, run_dir: Path, has_checkpoints: bool) -> None:
    """Before any checkpoint is read: refuse to continue the checkpoints of `run_dir` with a
    changed model or resume-relevant key, comparing with the run's `config.toml`; and the files
    that define the model kept in the run directory, or checked (`ModelSpec.keep_files`)."""
    spec = MODELS.get(cfg.model)
    if spec is not None and spec.keep_files:  # model=hf: the run's copy of its config.json
        spec.keep_files(cfg, RunDir.of(run_dir).path)
    path = RunDir.of(run_dir).config
    if not has_checkpoints or not path.is_file():
        return
    try:
        saved = read_toml(path)
        edited = edited_by_hand(path)
    except ConfigError as err:  # the checkpoint's own record is still compared after loading
        log.warning("%s; comparing the config with the checkpoint's record instead", err)
        return
    if edited:  # the checkpoint's record decides alone, so there is one answer, not two
        log.warning(
            "%s was edited after the run wrote it; comparing the config with the checkpoint's "
            "record instead (its values are the run's; the run rewrites config.toml)",
            path,
        )
        return
    # data/x/, ./data/x and /abs/data/x are one dataset (its contents are compared after loading)
    same_data = same_path(saved.get("dataset"), cfg.dataset)
    refuse_or_warn(changed_keys(saved, cfg, same_data), cfg, f"the run in {run_dir}")


def same_path(a: object, b: str) -> bool:
    return isinstance(a, str) and (a == b or Path(a).resolve() == Path(b).resolve())


def check_resume(
    saved: dict,
    cfg: Config,
    saved_world: int,
    world: int,
    saved_fingerprint: str | None = None,
    fingerprint: str | None = None,
) -> None:
    """Refuse to continue a checkpoint with settings or data that make it a different run.

    A different world size is allowed (checkpoints reshard): the global batch then changes,
    which the log says.
    """
    # the same data under another spelling of its path (data/x/, ./data/x, absolute) is the same
    same_data = bool(saved_fingerprint) and saved_fingerprint == fingerprint
    changed = changed_keys(saved, cfg, same_data)
    if saved_fingerprint and fingerprint and saved_fingerprint != fingerprint:
        why = (
            f"the files at {cfg.dataset} were rewritten"
            if same_path(saved.get("dataset"), cfg.dataset)
            else f"another dataset: {saved.get('dataset')} -> {cfg.dataset}"
        )
        changed.append(
            f"dataset contents: fingerprint {saved_fingerprint[:12]} -> {fingerprint[:12]} ({why})"
        )
    if saved_world != world:
        log.warning(
            "world size %d -> %d: the checkpoint is resharded; the global batch changes from "
            "%d to %d samples per step",
            saved_world,
            world,
            saved_world * cfg.batch_size * cfg.grad_accum_steps,
            world * cfg.batch_size * cfg.grad_accum_steps,
        )
    refuse_or_warn(changed, cfg, "the checkpoint")
