"""Getting batches onto the device: a plain feed, and a CUDA-stream prefetcher.

Both turn stored batches `(x, y)` (on the host, or already on the device for in-memory data)
into model inputs on the device: copy, stored integers -> float (`DataBundle.prepare`), memory
format (channels_last). The plain feed does it in the caller's stream when a batch is asked
for. The prefetcher does it for batch N+1 on a side stream while batch N computes, so the copy
and the conversion overlap with the model instead of preceding it. On CPU there is nothing to
overlap: `make_feed` returns the plain feed, and the results are the same either way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Optional, Union

import torch

# (x, y) from tuner's data; a user's own loader (ctx.loader) may also yield (x, y, ...) or x.
Batch = Union[torch.Tensor, tuple[torch.Tensor, ...]]


class Feed:
    """Plain iteration: each batch is moved and prepared when the loop asks for it."""

    def __init__(self, device: torch.device, prepare: Callable[[torch.Tensor], torch.Tensor]):
        self.device, self.prepare = device, prepare

    def __call__(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        for batch in batches:
            yield self.load(batch)

    def load(self, batch: Batch) -> Batch:
        # non_blocking pairs with pinned host memory (the DataLoader pins on CUDA): the copy
        # is queued and the host goes on. The first tensor is the input; the rest (labels,
        # targets) are only moved.
        if isinstance(batch, torch.Tensor):
            return self.prepare(batch.to(self.device, non_blocking=True))
        x, *rest = batch
        x = self.prepare(x.to(self.device, non_blocking=True))
        return (x, *(t.to(self.device, non_blocking=True) for t in rest))


class CudaPrefetcher(Feed):
    """Loads batch N+1 on a side stream while the loop computes on batch N."""

    def __init__(self, device: torch.device, prepare: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__(device, prepare)
        self.stream = torch.cuda.Stream(device)

    def __call__(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        it = iter(batches)
        ahead = self._ahead(it)
        while ahead is not None:
            main = torch.cuda.current_stream(self.device)
            main.wait_stream(self.stream)  # batch N's copy/convert is done before N is used
            for t in (ahead,) if isinstance(ahead, torch.Tensor) else ahead:
                # Allocated on the side stream, used on the main one: without this the
                # allocator could hand their memory to batch N+1 while N still computes.
                t.record_stream(main)
            batch, ahead = ahead, self._ahead(it)  # queue N+1 before N's compute is queued
            yield batch

    def _ahead(self, it: Iterator[Batch]) -> Optional[Batch]:
        # Everything of the next batch (gathering in-memory data by index, the copy, the
        # conversion) goes on the side stream.
        with torch.cuda.stream(self.stream):
            batch = next(it, None)
            return None if batch is None else self.load(batch)


def make_feed(
    device: torch.device,
    prepare: Callable[[torch.Tensor], torch.Tensor],
    prefetch: bool,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> Feed:
    """The prefetcher where it helps (`prefetch` and a CUDA device), else the plain feed."""

    def to_input(x: torch.Tensor) -> torch.Tensor:
        # contiguous() in the format the input already has returns the tensor itself.
        return prepare(x).contiguous(memory_format=memory_format)

    cls = CudaPrefetcher if prefetch and device.type == "cuda" else Feed
    return cls(device, to_input)


def input_format(
    channels_last: bool, input_shape: tuple[int, ...], log: logging.Logger
) -> torch.memory_format:
    """channels_last for image inputs (C, H, W) when asked, else the contiguous format."""
    if channels_last and len(input_shape) != 3:
        log.warning("training.channels_last ignored: inputs of shape %s are not images", input_shape)
    return torch.channels_last if channels_last and len(input_shape) == 3 else torch.contiguous_format
