"""make-dataset --images' decoding check (images.py calls it before writing anything): every
image decoded once with PIL's raster decoders, in a process pool when there are many, so a file
that does not decode, or whose pixels would be read wrongly, is one line naming it. Progress
(images done, rate, ETA) goes to stderr: one updating line on a terminal, a plain line every
PROGRESS_EVERY_S seconds in a job log.

The pool's workers die with the writer, kill -9 included: on Linux the kernel sends them SIGKILL
when it exits (prctl PR_SET_PDEATHSIG), elsewhere a thread in each worker watches its parent.
They leave Ctrl-C and SIGTERM to the writer, which stops the pool, as long as it lives.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from ..config_keys import first_line
from ..data.directory import DatasetError
from ..data.images import HIGH_BIT_MODES, high_bit_values, open_image, pil_image
from ..run.interrupts import die_with_parent
from .sources import format_seconds

POOL_MIN_IMAGES = 512  # fewer are checked in this process: starting a pool would cost more
PROGRESS_EVERY_S = 30.0  # a plain line in a job log; a terminal's line is redrawn every 0.5 s


# --- one image -------------------------------------------------------------------------------


def declared_bits(image, path: str) -> int:
    """Bits per channel the file says it holds (PNG: its header; TIFF: BitsPerSample)."""
    if image.format == "PNG":
        with open(path, "rb") as f:
            return f.read(26)[24]  # the IHDR chunk's bit depth
    if image.format == "TIFF":
        return max(image.tag_v2.get(258, (8,)))
    return 8


def image_mode(path: str) -> tuple[str, str, float, float]:
    """(PIL mode, "", low, high) of an image file that decodes, low and high the range of its
    values when it has one channel of more than 8 bits; else ("", why not, 0, 0)."""
    image_module = pil_image()
    try:
        with open_image(path) as image:
            image.load()
            values = high_bit_values(image)
            bits = declared_bits(image, path)
            if values is None:
                if bits > 8:
                    why = f"{bits}-bit {image.mode}: PIL would read 8 bits of each colour channel"
                    return "", why + "; save it as one channel (grey) or 8 bits", 0.0, 0.0
                if image.mode != "RGB":
                    image.convert("RGB")
                return image.mode, "", 0.0, 0.0
    except (OSError, SyntaxError, ValueError, image_module.DecompressionBombError) as err:
        return "", f"not an image that decodes ({first_line(err)})", 0.0, 0.0
    if not np.isfinite(values).all():
        return "", f"{image.mode} pixels that are not finite (NaN or inf)", 0.0, 0.0
    return image.mode, "", float(values.min()), float(values.max())


# --- the pool's workers ----------------------------------------------------------------------


def start_worker(parent: int) -> None:
    """A pool worker's initializer: die with `parent` (the writer), even after kill -9."""
    if not die_with_parent(parent):
        threading.Thread(target=watch_parent, args=(parent,), daemon=True).start()

    def stop_if_orphaned(signum, frame):
        if os.getppid() != parent:  # no writer left to stop the pool: stop
            os._exit(128 + signum)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the writer, which stops us
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_if_orphaned)


def watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


# --- progress --------------------------------------------------------------------------------


class Progress:
    """`make-dataset: decoded 12,000 of 90,000 images (13%), 2,410 images/s, ETA 0:00:32` on
    `stream` (stderr): redrawn in place on a terminal, a line every `every_s` seconds otherwise.
    Nothing for a pack shorter than that."""

    def __init__(self, what: str, total: int, every_s: float = PROGRESS_EVERY_S, stream=None):
        self.what, self.total, self.stream = what, total, stream or sys.stderr
        self.terminal = self.stream.isatty()
        self.every_s = 0.5 if self.terminal else every_s
        self.start = self.last = time.monotonic()
        self.done, self.shown = 0, False

    def update(self, count: int = 1) -> None:
        self.done += count
        if time.monotonic() - self.last >= self.every_s:
            self.show()

    def show(self) -> None:
        self.last = time.monotonic()
        elapsed = max(self.last - self.start, 1e-9)
        rate, fraction = self.done / elapsed, self.done / max(self.total, 1)
        eta = format_seconds((self.total - self.done) / rate) if rate > 0 else "?"
        line = (
            f"make-dataset: {self.what} {self.done:,} of {self.total:,} images ({fraction:.0%}), "
            f"{rate:,.0f} images/s, ETA {eta}"
        )
        end = "\n" if not self.terminal else ""
        print(("\r\033[K" if self.terminal else "") + line, end=end, file=self.stream, flush=True)
        self.shown = True

    def close(self) -> None:
        """On a terminal that showed the line: end it (the summary starts on a new line)."""
        if self.terminal and self.shown:
            self.show()
            print(file=self.stream, flush=True)


# --- the check -------------------------------------------------------------------------------


def check_images(paths: list[Path], workers: int) -> tuple[list[str], list[float] | None]:
    """(every image's mode, [low, high] of the values of its images of more than 8 bits or
    None), or one line naming the first file (in order) that does not decode or is refused."""
    names = [str(path) for path in paths]
    progress = Progress("decoded", len(names))
    results = []
    if workers > 1 and len(names) >= POOL_MIN_IMAGES:
        # the platform's default start method, as torch's DataLoader uses (fork on Linux: no
        # worker imports the package again)
        pool = ProcessPoolExecutor(workers, initializer=start_worker, initargs=(os.getpid(),))
        try:
            chunk = max(1, min(256, len(names) // (4 * workers)))
            for result in pool.map(image_mode, names, chunksize=chunk):
                results.append(result)
                progress.update()
        finally:
            pool.shutdown(cancel_futures=True)
            progress.close()
    else:
        for name in names:
            results.append(image_mode(name))
            progress.update()
        progress.close()
    for name, (mode, why, _, _) in zip(names, results, strict=True):
        if not mode:
            raise DatasetError(f"{name}: {why}")
    ranges = [(low, high) for mode, _, low, high in results if mode in HIGH_BIT_MODES]
    if not ranges:
        return [mode for mode, *_ in results], None
    pixel_range = [min(low for low, _ in ranges), max(high for _, high in ranges)]
    return [mode for mode, *_ in results], pixel_range
