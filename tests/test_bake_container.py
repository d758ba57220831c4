"""The generated container files: the EDF matches the chosen base image, and the Dockerfile's image
holds the dependencies but no copy of the project."""

from __future__ import annotations

import re
import shutil
import sys
import tomllib

from conftest import answers, clean_env, run


def test_edf_matches_base_image(baked):
    name, path = baked
    a = answers(name)
    edf_path = path / "container/edf.toml"
    if a["env_flavour"] == "uenv":
        assert not edf_path.exists()
        return
    edf = tomllib.loads(edf_path.read_text())
    extended = a["container_base"] == "alps-extended"
    tag = a["__alps_extended_tag"] if extended else a["__ngc_pytorch_tag"]
    assert edf["image"] == f"{a['image_dir']}/{path.name}+{tag}.sqsh"
    assert edf["workdir"] == "${PWD}"
    assert "${PWD}" in edf["mounts"]
    assert not any(m.rstrip("/") in ("${HOME}", "/users", "$HOME") for m in edf["mounts"])
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in edf["env"]  # the job script exports it
    assert edf["env"]["MPICH_GPU_SUPPORT_ENABLED"] == "0"
    assert not any(k.startswith(("NCCL_NET", "FI_CXI")) for k in edf["env"])
    ann = edf["annotations"]
    if extended:
        assert edf["entrypoint"] is True
        assert ann["com"]["hooks"]["cxi"]["enabled"] == "false"
        assert "aws_ofi_nccl" not in ann["com"]["hooks"]
        assert edf["env"]["PMIX_MCA_psec"] == "native"
    else:
        assert edf.get("entrypoint", False) is False
        assert ann["com"]["hooks"]["aws_ofi_nccl"] == {
            "enabled": "true",
            "variant": "cuda-dl",
        }
    dockerfile = (path / "Dockerfile").read_text()
    expected_from = (
        f"FROM ghcr.io/eth-cscs/alps-extended-images/ngc-pytorch:{tag}"
        if extended
        else f"FROM nvcr.io/nvidia/pytorch:{tag}-py3"
    )
    assert expected_from in dockerfile.splitlines()
    assert "-c /tmp/torch-constraint.txt" in dockerfile


def test_image_holds_the_dependencies_but_no_copy_of_the_project(bake, tmp_path):
    """The Dockerfile's RUN, run in a venv on this python (torch from outside, as in the image):
    the dependencies stay installed, the project does not (the venv's editable install is the
    one copy of the code a job runs; a copy in the image would shadow nothing but go stale)."""
    repo = bake("default")
    work = tmp_path / "opt" / repo.name
    shutil.copytree(repo, work, ignore=shutil.ignore_patterns(".git"))
    text = re.sub(r"\\\n", " ", (repo / "Dockerfile").read_text())
    command = next(line[4:] for line in text.splitlines() if line.startswith("RUN "))
    command = command.replace("/tmp/", f"{tmp_path}/").replace(f"/opt/{repo.name}", str(work))
    venv = tmp_path / "image-python"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=tmp_path)
    # offline and quick: build with this python's setuptools (the venv's seeded one is older)
    run([str(venv / "bin/pip"), "uninstall", "--quiet", "--yes", "setuptools"], cwd=tmp_path)
    env = clean_env() | {
        "PATH": f"{venv}/bin:{clean_env()['PATH']}",
        "PIP_NO_INDEX": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # sic: pip reads "0" as "no build isolation"
    }
    run(["bash", "-c", command], cwd=work, env=env, timeout=600)
    package = repo.name.replace("-", "_")
    probe = run([str(venv / "bin/python"), "-c", f"import {package}"], cwd=tmp_path, check=False)
    assert "ModuleNotFoundError" in probe.stderr
    assert not (work / "src").exists()
    run([str(venv / "bin/python"), "-c", "import numpy, torch"], cwd=tmp_path)
