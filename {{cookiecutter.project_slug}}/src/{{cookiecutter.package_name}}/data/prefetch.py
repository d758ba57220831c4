"""Input that overlaps compute: the next batches are gathered, pinned and copied to the GPU in a
background thread, on a side CUDA stream, while the current step runs.

Two rules make the overlap safe (the classic data-prefetcher bugs are breaking either):
- the compute stream waits for the copy's event before it uses a batch (`wait_event`: the GPU
  waits, the CPU does not);
- each batch's memory is marked as used by the compute stream (`record_stream`), so the caching
  allocator does not hand it to the next copy while the step still reads it.
On CPU the same class runs with `StandInCopier` (no copy), which the tests use to check order.
A prefetched batch that is never used (the run stops) is simply dropped: batches are a function
of the step (data.py), so a resumed run prepares it again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import torch

from .batches import map_tensors

_END = object()


class CudaCopier:
    """Host -> device copies on a side stream."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def bind_thread(self) -> None:
        torch.cuda.set_device(self.device)  # the current device is per thread

    def copy(self, batch):
        """Every tensor of the batch (a tuple, a dict, ...) copied; pinned first if it is not."""

        def to_device(t: torch.Tensor) -> torch.Tensor:
            if not (t.is_cuda or t.is_pinned()):
                t = t.pin_memory()
            return t.to(self.device, non_blocking=True)

        with torch.cuda.stream(self.stream):
            out = map_tensors(to_device, batch)
            event = torch.cuda.Event()
            event.record(self.stream)
        return out, event

    def ready(self, out, event):
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(event)
        map_tensors(lambda tensor: tensor.record_stream(compute), out)
        return out


class StandInCopier:
    """The CPU stand-in: same protocol, no copy; with `record`, `log` keeps the order of
    operations (for tests)."""

    def __init__(self, record: bool = False) -> None:
        self.record, self.log = record, []
        self._copied = 0

    def bind_thread(self) -> None:
        pass

    def copy(self, batch):
        self._copied += 1
        if self.record:
            self.log.append(("copy", self._copied))
        return batch, self._copied

    def ready(self, out, event: int):
        if self.record:
            self.log.append(("ready", event))
        return out


class Prefetcher:
    """Iterator over `batches` on the device, `depth` batches ahead.

    `wait_s` accumulates the time `next()` blocked: the input pipeline's share of the step.
    """

    def __init__(self, batches: Iterator, copier, depth: int = 2, threaded: bool = True):
        self.batches, self.copier, self.threaded = batches, copier, threaded
        self.wait_s = 0.0
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = None
        if threaded:
            self._thread = threading.Thread(target=self._fill, name="prefetch", daemon=True)
            self._thread.start()

    def _fill(self) -> None:
        try:
            self.copier.bind_thread()
            for batch in self.batches:
                item = self.copier.copy(batch)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._queue.put(_END)
        except BaseException as err:  # handed to the training thread, raised there
            self._queue.put(err)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self):
        start = time.perf_counter()
        if self.threaded:
            item = self._queue.get()
        else:
            batch = next(self.batches, _END)
            item = batch if batch is _END else self.copier.copy(batch)
        self.wait_s += time.perf_counter() - start
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return self.copier.ready(*item)

    def close(self) -> None:
        """Stop the thread (dropping what it prepared), then the batches' own source (loader
        processes: batches.LoaderBatches); safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._queue.get(timeout=0.1)
                except queue.Empty:
                    pass
            self._thread = None
        close = getattr(self.batches, "close", None)
        if close is not None:
            close()
