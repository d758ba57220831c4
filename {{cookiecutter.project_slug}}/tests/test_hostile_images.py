"""Hostile image files (docs/data.md#what-a-dataset-may-hold): the records of an images
dataset checked at open, and --shard-mb's value, each in one line (test_hostile_data.py: what
every dataset's index.json is checked for)."""

import hashlib
import io
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import one_line
from test_hostile_data import mutated_index

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.data import kinds
from {{ cookiecutter.package_name }}.data.augmentation import AugmentationKeys
from {{ cookiecutter.package_name }}.data.directory import DatasetError

# --- images: train-index.npy -----------------------------------------------------------------


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    pytest.importorskip("torchvision", reason="needs the [vision] extra")
    from test_images import image_folder

    from {{ cookiecutter.package_name }}.make_dataset.images import write_image_dataset

    root = tmp_path_factory.mktemp("images")
    write_image_dataset(image_folder(root / "folder", per_class=3), root / "ds", workers=1)
    return root / "ds"


def with_length(length: int, offset: int | None = None):
    def change(records):
        records = records.copy()
        records["length"][0] = length
        records["offset"][0] = records["offset"][0] if offset is None else offset
        return records

    return change


@pytest.mark.parametrize(
    "change, expected",
    [
        (with_length(-5), "record 0 has a length of no bytes"),
        (with_length(0), "record 0 has a length of no bytes"),
        (with_length(2**62, 2**62), "record 0 lies outside its shard"),  # the sum overflows
        (lambda records: np.array([{"a": 1}], dtype=object), "not an array of records"),
        (lambda records: records.reshape(-1, 1), "not the records of make-dataset --images"),
        (lambda records: np.arange(len(records)), "not the records of make-dataset --images"),
    ],
)
def test_image_records_are_checked_at_open(images, tmp_path, change, expected):
    directory = shutil.copytree(images, tmp_path / "ds")
    buffer = io.BytesIO()
    np.save(buffer, change(np.load(directory / "train-index.npy")), allow_pickle=True)
    (directory / "train-index.npy").write_bytes(buffer.getvalue())
    digest = "sha256:" + hashlib.sha256(buffer.getvalue()).hexdigest()
    mutated_index(directory, lambda index: index["train"].update(sha256=digest))
    cfg = SimpleNamespace(image_size=16, **vars(AugmentationKeys()))
    with pytest.raises(DatasetError, match=expected):
        kinds.KINDS["images"].open(directory, cfg, None)


@pytest.mark.parametrize("value", ["inf", "nan", "1e999"])
def test_a_shard_size_that_is_no_finite_number_is_refused(capsys, value):
    with pytest.raises(SystemExit) as exit_:
        main(["make-dataset", "--images", "d", "--out", "o", "--shard-mb", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "argument --shard-mb: expects a finite number" in err, err


def test_a_negative_shard_size_is_one_line(capsys):
    assert main(["make-dataset", "--images", "d", "--out", "o", "--shard-mb", "-1"]) == 2
    assert "--shard-mb must be positive, got -1.0" in one_line(capsys)
