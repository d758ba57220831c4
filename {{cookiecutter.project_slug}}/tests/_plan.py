"""What a run allocates and what autograd keeps, measured on the CPU, for the plan's accuracy
tests (test_plan.py: the MLP; test_plan_language.py: the GPT and a Llama)."""

from __future__ import annotations

import torch

from {{ cookiecutter.package_name }}.data.batches import example_batch, map_tensors


def storage_bytes(tensors) -> int:
    """Bytes of the storages under `tensors` (a DTensor's: its rank's part), each storage once
    (FSDP2's gradients of a unit share one)."""
    sizes = {}
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        sizes[local.untyped_storage()._cdata] = local.untyped_storage().nbytes()
    return sum(sizes.values())


def micro_batch(run):
    """The run's micro-batch of real data: its first sample, batch_size times."""
    example = example_batch(run.source, run.cfg)
    size = run.cfg.batch_size
    return map_tensors(lambda t: t.expand(size, *t.shape[1:]).contiguous(), example)


def states_after_one_step(run) -> dict[str, int]:
    """A built run's parameters (and buffers), gradients and AdamW states after one real
    optimizer step, in bytes on this rank, as the plan names them."""
    run.spec.task.loss(run.model, micro_batch(run)).backward()
    run.optimizer.step()
    params = list(run.model.parameters())
    states = [v for s in run.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "weights": storage_bytes(params) + storage_bytes(run.model.buffers()),
        "gradients": storage_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": storage_bytes(states),
    }


def saved_activation_bytes(run) -> int:
    """Bytes autograd keeps for backward in one forward of the run's micro-batch: each storage
    once, the parameters' left out (the plan counts them as weights)."""
    params = {p.untyped_storage()._cdata for p in run.model.parameters()}
    seen: dict[int, torch.Tensor] = {}

    def pack(tensor):
        key = tensor.untyped_storage()._cdata
        if key not in params:
            seen.setdefault(key, tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run.spec.task.loss(run.model, micro_batch(run))
    return sum(t.untyped_storage().nbytes() for t in seen.values())
