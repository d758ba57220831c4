"""Datasets, the resumable sampler, the loader position, make-dataset."""

import signal

import numpy as np
import torch

from {{ cookiecutter.package_name }} import data
from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config import load_config


def small_set(n=100):
    x, y = data.synthetic_arrays(n, 3, 4, seed=0)
    return data.ArrayDataset(x, y, 4)


def test_synthetic_data_is_deterministic():
    a, b = data.synthetic_arrays(50, 3, 4, 7), data.synthetic_arrays(50, 3, 4, 7)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], data.synthetic_arrays(50, 3, 4, 8)[0])


def batches_of(ds, rank, epoch, start_batch, n):
    loader = data.make_loader(ds, 4, rank, 2, seed=1, shuffle=True, workers=0, pin=False)
    it = data.Batches(loader, epoch, start_batch)
    return [next(it) for _ in range(n)], it


def test_resuming_at_an_offset_gives_the_same_batches_without_replaying():
    ds = small_set()  # 50 samples per rank, 12 batches per epoch
    full, _ = batches_of(ds, rank=1, epoch=0, start_batch=0, n=20)
    tail, it = batches_of(ds, rank=1, epoch=0, start_batch=7, n=13)
    for (xa, ya), (xb, yb) in zip(full[7:], tail, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert it.state_dict() == {"epoch": 1, "batch_in_epoch": 8}
    assert len(it.loader.sampler) == 50  # the next epoch starts at 0 again


def test_epochs_are_shuffled_differently_and_ranks_are_disjoint():
    ds = small_set()
    epoch0, _ = batches_of(ds, 0, 0, 0, 12)
    epoch1, _ = batches_of(ds, 0, 1, 0, 12)
    other, _ = batches_of(ds, 1, 0, 0, 12)
    assert not torch.equal(epoch0[0][0], epoch1[0][0])  # set_epoch reshuffles
    rows = [{tuple(r.tolist()) for x, _ in bs for r in x} for bs in (epoch0, other)]
    assert len(rows[0]) == 48 and not rows[0] & rows[1]


def test_make_dataset_writes_a_memmap_directory_that_trains(tmp_path, capsys):
    out = tmp_path / "ds"
    assert (
        main(
            [
                "make-dataset",
                "--out",
                str(out),
                "--samples",
                "300",
                "--features",
                "5",
                "--classes",
                "3",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "x.npy", "y.npy"]
    ds = data.open_dataset(out)
    assert isinstance(ds.x, np.memmap) and (len(ds), ds.num_features, ds.num_classes) == (300, 5, 3)
    x, y = ds.__getitems__([5, 1])
    assert x.shape == (2, 5) and y.dtype == torch.int64

    np.save(tmp_path / "x.npy", np.asarray(ds.x)[:200])
    np.save(tmp_path / "y.npy", np.asarray(ds.y)[:200])
    assert (
        main(
            [
                "make-dataset",
                "--out",
                str(tmp_path / "from_npy"),
                "--x",
                str(tmp_path / "x.npy"),
                "--y",
                str(tmp_path / "y.npy"),
            ]
        )
        == 0
    )
    again = data.open_dataset(tmp_path / "from_npy")
    assert np.array_equal(again.x, np.asarray(ds.x)[:200])

    cfg = load_config(None, [f"dataset={out}", "eval_samples=50"])
    train, evaluation = data.load_datasets(cfg)
    assert (len(train), len(evaluation), train.num_features) == (250, 50, 5)


def test_num_workers_from_slurm_cpus_per_task(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert data.resolve_num_workers(-1) == 0
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "72")
    assert data.resolve_num_workers(-1) == 8
    assert data.resolve_num_workers(0) == 0 and data.resolve_num_workers(3) == 3


def test_loader_workers_ignore_preemption_signals():
    previous = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    try:
        data.worker_init(0)
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_loader_with_workers_matches_loader_without():
    ds = small_set()
    plain = data.make_loader(ds, 4, 0, 2, seed=1, shuffle=True, workers=0, pin=False)
    pooled = data.make_loader(ds, 4, 0, 2, seed=1, shuffle=True, workers=2, pin=False)
    for (xa, _), (xb, _) in zip(plain, pooled, strict=True):
        assert torch.equal(xa, xb)
