"""Step-indexed batches (MLP arrays), the sample stream and per-sample seeds, loader processes,
make-dataset for arrays, GPU placement."""

import json
import signal

import numpy as np
import pytest
import torch
from conftest import one_line

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.config.settings import load_config
from {{ cookiecutter.package_name }}.data import arrays
from {{ cookiecutter.package_name }}.data import batches as data
from {{ cookiecutter.package_name }}.data.directory import DatasetError
from {{ cookiecutter.package_name }}.data.kinds import open_splits
from {{ cookiecutter.package_name }}.models import spec_of

MLP = ["model=mlp", "synthetic_samples=120", "eval_samples=20", "num_features=3", "batch_size=4"]


def source_and_batches(rank=0, world=2, start_step=0, samples_seen=0, extra=()):
    cfg, _ = load_config(None, [*MLP, "grad_accum_steps=2", *extra])
    source = open_splits(cfg, spec_of(cfg))  # model=mlp: a classifier's arrays
    return source, data.StepBatches(source, cfg, rank, world, start_step, samples_seen)


def test_synthetic_data_is_deterministic():
    a, b = arrays.synthetic_arrays(50, 3, 4, 7), arrays.synthetic_arrays(50, 3, 4, 7)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], arrays.synthetic_arrays(50, 3, 4, 8)[0])


def test_a_batch_is_a_function_of_the_step_alone():
    _, fresh = source_and_batches()
    _, resumed = source_and_batches(start_step=7, samples_seen=7 * 2 * 2 * 4)
    for step in (7, 8, 30):
        for micro in (0, 1):
            xa, ya = fresh.batch(step, micro)
            xb, yb = resumed.batch(step, micro)
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_inline_input_gathers_several_steps_of_arrays_at_once(monkeypatch):
    """Without loader processes the arrays' micro-batches are those `batch` reads one by one,
    in order, from any start step (across an epoch's end), gathered DRAW_AHEAD_STEPS at once."""
    source, batches = source_and_batches(rank=1, start_step=5, samples_seen=5 * 16)
    calls = []
    gather_many = source.train.gather_many
    monkeypatch.setattr(source.train, "gather_many", lambda c: calls.append(c) or gather_many(c))
    inline = list(data.micro_batches(batches, 80, workers=0, pin=False))  # 1000 samples an epoch
    assert len(inline) == 75 * 2 and [len(c) for c in calls] == [20] * 7 + [10]
    for k, (x, y) in enumerate(inline):
        expected_x, expected_y = batches.batch(5 + k // 2, k % 2)
        assert torch.equal(x, expected_x) and torch.equal(y, expected_y)


def test_every_sample_once_per_epoch_and_ranks_disjoint():
    source, rank0 = source_and_batches(rank=0)
    _, rank1 = source_and_batches(rank=1)
    per_step = 2 * 2 * 4  # accum x world x batch
    size = len(source.train)
    steps = size // per_step  # 100 training samples: 6 whole steps
    rows = [
        {tuple(r.tolist()) for s in range(steps) for m in (0, 1) for r in b.batch(s, m)[0]}
        for b in (rank0, rank1)
    ]
    assert len(rows[0]) == len(rows[1]) == steps * 2 * 4 and not rows[0] & rows[1]
    stream = data.SampleStream(size, seed=1234)
    epoch0, epochs = stream.take(0, size)
    assert sorted(epoch0.tolist()) == list(range(size)) and set(epochs.tolist()) == {0}
    assert not np.array_equal(epoch0, stream.take(size, size)[0])


def test_resharding_continues_the_same_sample_stream():
    """2 ranks until step 5, then 1 rank: the stream position carries over."""
    source, _ = source_and_batches(world=2)
    seen = 5 * 2 * 2 * 4
    _, one = source_and_batches(rank=0, world=1, start_step=5, samples_seen=seen)
    x, _ = one.batch(5, 0)
    expected, _ = source.train.gather(data.SampleStream(len(source.train), 1234).take(seen, 4)[0])
    assert torch.equal(x, expected)
    assert one.samples_seen(6) == seen + 2 * 1 * 4


def test_loader_processes_give_the_same_batches_in_order():
    _, batches = source_and_batches()
    plain = list(data.micro_batches(batches, 6, workers=0, pin=False))
    pooled = list(data.micro_batches(batches, 6, workers=2, pin=False))
    assert len(plain) == len(pooled) == 12
    for (xa, ya), (xb, yb) in zip(plain, pooled, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_eval_set_is_the_held_out_tail_split_over_ranks():
    source, _ = source_and_batches()
    a = data.eval_batches(source, 4, 0, 2, 100)
    b = data.eval_batches(source, 4, 1, 2, 100)
    rows = [{tuple(r.tolist()) for x, _ in s for r in x} for s in (a, b)]
    assert len(rows[0]) + len(rows[1]) == 20 and not rows[0] & rows[1]


class Numbered(torch.utils.data.Dataset):
    """Sample i is (i, i), read one by one and collated, as images are."""

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        return torch.tensor(float(index)), index


def test_every_validation_sample_is_scored_once_on_any_number_of_ranks():
    """7 samples, batches of 2: on 1, 2, 3 and 8 ranks each sample once (none left out when
    the ranks do not divide them), and every rank as many batches (the extra ones not scored);
    eval_batches=1 scores the same 2 samples on any number of ranks."""
    source = data.Splits(train=None, val=Numbered(7), info=None)
    for world, cap in [(1, None), (2, None), (3, None), (8, None), (1, 1), (3, 1)]:
        sets = [data.eval_batches(source, 2, rank, world, cap) for rank in range(world)]
        assert len({len(s.chunks) for s in sets}) == 1
        scored = sorted(
            i for s in sets for k, (_, y) in enumerate(s) if k < s.scored for i in y.tolist()
        )
        assert scored == ([0, 6] if cap else list(range(7))), world
        assert sets[0].scoreable == 7


def test_make_dataset_writes_a_memmap_directory_that_trains(tmp_path):
    out = tmp_path / "ds"
    argv = ["make-dataset", "--out", str(out), "--samples", "300", "--features", "5"]
    assert main([*argv, "--classes", "3"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "x.npy", "y.npy"]
    x, y, classes, fingerprint = arrays.open_dataset(out)
    assert isinstance(x, np.memmap) and x.shape == (300, 5) and classes == 3

    np.save(tmp_path / "x.npy", np.asarray(x)[:200])
    np.save(tmp_path / "y.npy", np.asarray(y)[:200])
    copy = tmp_path / "from_npy"
    npy = ["--x", str(tmp_path / "x.npy"), "--y", str(tmp_path / "y.npy")]
    assert main(["make-dataset", "--out", str(copy), *npy]) == 0
    again = arrays.open_dataset(copy)
    assert np.array_equal(again[0], np.asarray(x)[:200])
    assert again[3] != fingerprint  # other contents, other fingerprint

    cfg, _ = load_config(None, ["model=mlp", f"dataset={out}", "eval_samples=50"])
    source = open_splits(cfg, spec_of(cfg))  # model=mlp: a classifier's arrays
    assert (len(source.train), source.info.num_features, source.info.fingerprint) == (
        250,
        5,
        fingerprint,
    )


@pytest.mark.parametrize(
    "y, x_value, classes, expected",
    [([0, 1, -1, 2], 0.0, None, "y.npy: row 2 has label -1; labels are whole numbers 0 or more"),
     ([0, 1, 2, 3], 0.0, 3, "y.npy: row 3 has label 3; labels are whole numbers 0 to 2 "
      "(--classes 3)"),
     ([0.0, 1.5, 1.0, 0.0], 0.0, None, "y.npy: row 1 has label 1.5; labels are whole"),
     ([0.0, 1.0, np.nan, 0.0], 0.0, None, "y.npy: row 2 has label nan; labels are whole"),
     ([0, 1, 1, 0], np.nan, None, "x.npy: row 3 holds a NaN or infinite feature"),
     ([0, 1, 1, 0], -1e39, None, "x.npy: row 3 holds a feature beyond float32's range (-1e+39")],
    ids=["negative", "above --classes", "a fraction", "nan label", "nan feature", "too large"],
)  # fmt: skip
def test_arrays_of_wrong_labels_or_features_are_one_line_and_write_nothing(
    tmp_path, y, x_value, classes, expected, capsys
):
    """A float label was cut to an integer when stored, a label out of range stopped training
    with an index error, a NaN feature made every loss NaN (a float64 beyond float32's range
    too: it was stored as inf)."""
    x = np.zeros((4, 3), dtype=np.float64)
    x[3, 1] = x_value
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.array(y))
    argv = ["make-dataset", "--out", str(tmp_path / "ds"), "--x", str(tmp_path / "x.npy")]
    argv += ["--y", str(tmp_path / "y.npy")] + (["--classes", str(classes)] if classes else [])
    assert main(argv) == 2
    assert expected in one_line(capsys) and not (tmp_path / "ds").exists()


def test_labels_beyond_the_classes_index_json_names_are_refused_at_open(tmp_path):
    out = tmp_path / "ds"
    assert main(["make-dataset", "--out", str(out), "--samples", "50", "--classes", "4"]) == 0
    index = json.loads((out / "index.json").read_text())
    (out / "index.json").write_text(json.dumps(index | {"num_classes": 2}))
    with pytest.raises(DatasetError, match=r"y.npy holds labels 0 to 3, but index.json says 2 cl"):
        arrays.open_dataset(out)


def test_a_dataset_path_that_is_not_a_dataset_says_which_and_why(tmp_path):
    from {{ cookiecutter.package_name }}.config_keys import ConfigError
    from {{ cookiecutter.package_name }}.data.kinds import kind_of_directory

    with pytest.raises(ConfigError, match=r"dataset .*nowhere: no such directory$"):
        kind_of_directory(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"dataset .*: no index.json; dataset directories"):
        kind_of_directory(tmp_path)  # a directory, but not one make-dataset wrote


def test_num_workers_from_slurm_cpus_per_task(monkeypatch):
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert data.resolve_num_workers(-1, decodes=True) == 0
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "72")
    assert data.resolve_num_workers(-1, decodes=False) == 8  # slicing arrays: 8 are plenty
    assert data.resolve_num_workers(-1, decodes=True) == 71  # decoding: every CPU but one
    assert data.resolve_num_workers(0, True) == 0 and data.resolve_num_workers(3, False) == 3


def test_loader_workers_ignore_preemption_signals():
    signals = (signal.SIGUSR2, signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.getsignal(s) for s in signals}
    try:
        data.worker_init(0)
        assert [signal.getsignal(s) for s in signals] == [signal.SIG_IGN] * 4
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_dataset_stays_on_the_host_on_cpu_and_when_told():
    assert not data.fits_on_gpu(10, torch.device("cpu"), "true")
    assert not data.fits_on_gpu(10, torch.device("cuda", 0), "false")
    assert data.fits_on_gpu(10, torch.device("cuda", 0), "true")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_resident_batches_equal_host_batches():
    _, host = source_and_batches()
    source, on_gpu = source_and_batches()
    source.to(torch.device("cuda", 0))
    for step, micro in ((0, 0), (9, 1)):
        xa, ya = host.batch(step, micro)
        xb, yb = on_gpu.batch(step, micro)
        assert xb.is_cuda and torch.equal(xa, xb.cpu()) and torch.equal(ya, yb.cpu())


class Noisy(torch.utils.data.Dataset):
    """A sample with random augmentation drawn from the global generators, as torchvision's
    transforms and most users' code draw it."""

    def __len__(self):
        return 10

    def __getitem__(self, index):
        return torch.tensor([float(index)]) + torch.rand(1), torch.tensor(index)


def test_a_samples_augmentation_is_a_function_of_seed_epoch_and_index():
    split = Noisy()
    indices, epochs = np.array([3, 5, 3]), np.array([0, 0, 1])
    first, _ = data.read_samples(split, indices, epochs, 7, torch.utils.data.default_collate)
    torch.rand(100)  # the training process's generator moved on: no effect on the samples
    again, labels = data.read_samples(split, indices, epochs, 7, torch.utils.data.default_collate)
    assert torch.equal(first, again) and labels.tolist() == [3, 5, 3]
    assert first[0] != first[2]  # index 3 in epoch 0 and in epoch 1: other augmentations
    other, _ = data.read_samples(split, indices, epochs, 8, torch.utils.data.default_collate)
    assert not torch.equal(first, other)
    state = torch.random.get_rng_state()
    data.read_samples(split, indices, epochs, 7, torch.utils.data.default_collate)
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's generator restored
