"""`plan`: what a run needs per GPU under each layout, from its config, with no GPU. Its model
states equal what a run allocates on the CPU (one rank; FSDP2's shards on two ranks of a
process group that moves no data), its activations what autograd keeps in a real step; its
output, recommendation and bad input. The GPT and Llama cases: test_plan_language.py."""

import dataclasses
import json

import pytest
import torch
from _plan import saved_activation_bytes, states_after_one_step
from conftest import TINY
from torch import nn

from {{ cookiecutter.package_name }}.commands.plan import layouts, recommend, shard_size
from {{ cookiecutter.package_name }}.config.settings import load_config
from {{ cookiecutter.package_name }}.config_keys import ConfigError
from {{ cookiecutter.package_name }}.distributed import DistEnv
from {{ cookiecutter.package_name }}.training import plan
from {{ cookiecutter.package_name }}.training.build import build

# 17 wide and 5 classes: rows that two ranks do not share evenly (FSDP2 pads the last part)
MLP = [*TINY, "hidden_dim=17", "num_classes=5", "precision=fp32"]


def built(args: list[str], world: int = 1):
    cfg = load_config(None, args).config
    env = DistEnv(0, world, 0, world, "localhost", 0, "single")
    return cfg, build(cfg, env, torch.device("cpu"))


def planned_states(cfg, shard: int) -> dict[str, int]:
    return plan.model_state_bytes(plan.measure_model(cfg), shard)


def test_model_states_and_activations_equal_a_real_steps(single_process):
    cfg, run = built(MLP)
    activations = saved_activation_bytes(run)
    assert planned_states(cfg, 1) == states_after_one_step(run)
    assert plan.measure_model(cfg).activations == activations > 0


@pytest.fixture
def fake_ranks():
    """A process group of `world` ranks in this process whose collectives move nothing (torch's
    own test backend): FSDP2 shards as on real ranks, and this process is rank 0."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def start(world: int):
        torch.distributed.init_process_group("fake", rank=0, world_size=world, store=FakeStore())

    yield start
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_fsdp_states_equal_a_ranks_shard(single_process, fake_ranks):
    fake_ranks(2)
    cfg, run = built([*MLP, "parallelism=fsdp"], world=2)
    assert planned_states(cfg, 2) == states_after_one_step(run)


def test_hsdp_states_equal_a_ranks_shard_on_a_2d_mesh(single_process, fake_ranks):
    """FSDP2 on a (replicate, shard) mesh of 2 x 2 (what HSDP is) keeps a shard of 2."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    fake_ranks(4)
    cfg, run = built(MLP)  # one rank's run, sharded here as HSDP's is
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    fully_shard(run.model, mesh=mesh)
    run.optimizer = torch.optim.AdamW(run.model.parameters())
    assert planned_states(cfg, 2) == states_after_one_step(run)


def test_the_table_and_the_json_object(cli):
    table = cli("plan", *MLP, "precision=auto", "nodes=2")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("mlp: ") and "bf16" in lines[0] and "2 node(s) of 4 GPUs" in lines[0]
    assert "(6 GiB reserved for CUDA, NCCL and fragmentation)" in lines[1]
    assert lines[2].startswith("step time at 40% MFU of 989 TFLOP/s")
    rows = [line.split()[0] for line in lines[6:9]]
    assert rows == ["ddp", "fsdp", "hsdp/4"]
    assert len(lines) == 11  # the MLP has no blocks: no checkpointed rows
    assert lines[-1].startswith("recommended: parallelism=ddp (")
    result = json.loads(cli("plan", *MLP, "nodes=2", "--json").stdout)
    assert result["parameters"] == 8 * 17 + 17 + 17 * 17 + 17 + 17 * 5 + 5
    assert [row["shard_gpus"] for row in result["layouts"]] == [1, 8, 4]
    named = {"parallelism", "nodes", "activation_checkpointing", "gib_per_gpu", "fits", "step_s"}
    for row in result["layouts"]:
        assert named <= set(row)
        assert row["nodes"] == 2 and row["fits"] and row["step_s"] > 0
    fsdp = result["layouts"][1]
    assert fsdp["nvlink_gib"] == 0 and fsdp["slingshot_gib"] > 0  # 8 GPUs over 2 nodes
    assert result["recommended"] == result["layouts"][0]


def test_the_recommendation_is_the_cheapest_that_fits():
    rows = [
        {"parallelism": p, "activation_checkpointing": ac, "fits": fits}
        for p, ac, fits in [
            ("ddp", False, False),
            ("fsdp", False, True),
            ("hsdp", False, True),
            ("ddp", True, True),
        ]
    ]
    assert recommend(rows)["parallelism"] == "hsdp"  # without checkpointing first
    assert recommend(rows[:1] + rows[3:])["activation_checkpointing"] is True
    assert recommend(rows[:1]) is None


@pytest.mark.parametrize("nodes", ["0", "-1", "two", "\u0662", "1.5", ""])
def test_nodes_not_a_positive_whole_number_is_refused_in_one_line(cli, nodes):
    result = cli("plan", *MLP, f"nodes={nodes}")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "nodes= expects a positive whole number" in (
        result.stderr
    )


def test_a_model_that_cannot_be_built_on_meta_is_refused_in_one_line(cli, monkeypatch):
    class ReadsItsWeights(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))
            self.scale = float(self.weight.detach().sum())  # a value: the meta device has none

    from {{ cookiecutter.package_name }} import models

    spec = dataclasses.replace(models.MODELS["mlp"], build=lambda cfg, info: ReadsItsWeights())
    monkeypatch.setitem(models.MODELS, "mlp", spec)
    result = cli("plan", *MLP)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert "model=mlp cannot be built and run on the meta device" in result.stderr


def test_hsdp_shards_that_do_not_divide_and_hsdp_on_one_gpu_are_refused():
    """The plan's HSDP group is the run's: hsdp_shard, or one node's GPUs when it is 0."""

    def config(*items: str):
        return load_config(None, [*MLP, *items]).config

    with pytest.raises(ConfigError, match="'hsdp_shard' is 3, which does not divide the 8"):
        shard_size(config("parallelism=hsdp", "hsdp_shard=3"), 8, 4)
    assert shard_size(config("parallelism=hsdp"), 8, 4) == 4  # a node's GPUs
    assert shard_size(config("parallelism=hsdp", "hsdp_shard=2"), 8, 4) == 2
    with pytest.raises(ConfigError, match="parallelism=hsdp needs 2 GPUs or more"):
        layouts(config("parallelism=hsdp"), 1, 1, True)
    assert [x.parallelism for x in layouts(config("parallelism=ddp"), 1, 1, True)] == [
        "ddp",
        "ddp",
    ]
