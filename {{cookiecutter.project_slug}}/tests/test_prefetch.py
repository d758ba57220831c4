"""The prefetcher: order, overlap, errors and shutdown with the CPU stand-in for the CUDA stream
(the protocol the GPU path uses), and the real side stream where a GPU exists."""

import threading

import pytest
import torch

from {{ cookiecutter.package_name }}.data.prefetch import CudaCopier, Prefetcher, StandInCopier


def numbered(n, started=None):
    for i in range(n):
        if started is not None:
            started.append(i)
        yield (torch.full((2,), float(i)), torch.tensor([i]))


@pytest.mark.parametrize("threaded", [True, False])
def test_batches_come_in_order_each_made_ready_after_its_copy(threaded):
    copier = StandInCopier(record=True)
    out = [int(y) for _, y in Prefetcher(numbered(7), copier, depth=2, threaded=threaded)]
    assert out == list(range(7))
    readies = [k for op, k in copier.log if op == "ready"]
    assert readies == list(range(1, 8))
    for k in readies:  # a batch is used only after its copy was issued
        assert copier.log.index(("copy", k)) < copier.log.index(("ready", k))


def test_the_next_batch_is_prepared_while_the_current_one_is_used():
    started: list[int] = []
    inputs = Prefetcher(numbered(10, started), StandInCopier(), depth=2)
    next(inputs)
    deadline = threading.Event()
    while len(started) < 3 and not deadline.wait(0.01):  # the thread runs ahead on its own
        pass
    assert len(started) >= 3  # batch 0 consumed, 1 and 2 already prepared
    inputs.close()


def test_an_error_in_the_input_reaches_the_training_thread():
    def broken():
        yield (torch.zeros(1), torch.zeros(1))
        raise OSError("disk gone")

    inputs = Prefetcher(broken(), StandInCopier())
    next(inputs)
    with pytest.raises(OSError, match="disk gone"):
        next(inputs)


def test_close_stops_the_thread_and_drops_prepared_batches():
    inputs = Prefetcher(numbered(1000), StandInCopier(), depth=2)
    next(inputs)
    thread = inputs._thread
    inputs.close()
    assert not thread.is_alive()
    inputs.close()  # twice is fine


def test_wait_time_is_measured():
    inputs = Prefetcher(numbered(3), StandInCopier(), threaded=False)
    list(inputs)
    assert inputs.wait_s > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_side_stream_copies_arrive_intact_on_the_gpu():
    device = torch.device("cuda", 0)
    batches = [(torch.randn(64, 128), torch.arange(64)) for _ in range(6)]
    inputs = Prefetcher(iter(batches), CudaCopier(device), depth=2)
    for (x, y), (xd, yd) in zip(batches, inputs, strict=True):
        assert xd.is_cuda and torch.equal((xd * 1).cpu(), x) and torch.equal(yd.cpu(), y)
    inputs.close()
