"""Datasets and batches: built-ins (digits, synthetic, synthetic_images) and the user's own.

Every dataset yields `(x, y)`. Inputs may be stored compactly (digits and synthetic images
as uint8) and are turned into float on the device (`DataBundle.prepare`), so host-to-device
copies move a quarter of the bytes.

Batches come from one index plan for every mode: a `DistributedSampler` orders (and, with
several workers, shards) the training indices of an epoch; each step takes
`batch_size // world_size` of them. In-memory tensors are gathered directly by index (no
per-sample Python); any other dataset goes through a `DataLoader` with the same indices.
Batches are yielded where they are stored; `trial.loop.prefetch` moves and prepares them.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from tuner import catalogue


class TensorData(Dataset):
    """An in-memory dataset of stacked inputs and labels (gathered by index, no loader)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        assert len(x) == len(y), "inputs and labels differ in length"
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


@dataclass
class DataBundle:
    """A task's data: splits, input shape, classes and the on-device input preparation.

    `num_classes` is None when the targets are not class indices (see `_num_classes`).
    """

    train: Dataset
    val: Dataset
    input_shape: tuple[int, ...]
    num_classes: Optional[int]
    scale: Optional[float] = None  # inputs stored as integers are multiplied by this on device

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """Raw stored input -> float model input, on whatever device `x` is (a float input
        is taken as prepared already: see Batches, which converts in-memory data once)."""
        if x.is_floating_point():
            return x
        if self.scale is not None:
            return x.float().mul_(self.scale)
        return x.float()


# ----------------------------------------------------------------------------- built-ins


def _digits(args: dict[str, Any]) -> DataBundle:
    """sklearn's 8x8 digits (1797 images, shipped with scikit-learn); fixed stratified split."""
    from tuner.trial.loop import digits

    # Pixel values are integers 0..16: stored uint8, scaled to [0, 1] on the device.
    xtr, xva, ytr, yva = digits.load(float(args.get("val_fraction", 0.25)))
    t = torch.from_numpy
    return DataBundle(
        TensorData(t(xtr), t(ytr).long()),
        TensorData(t(xva), t(yva).long()),
        input_shape=(1, 8, 8),
        num_classes=10,
        scale=1 / 16,
    )


def _synthetic(args: dict[str, Any]) -> DataBundle:
    """Gaussian class clusters: `samples` points of `features` dims in `classes` classes."""
    n = int(args.get("samples", 4096))
    d = int(args.get("features", 32))
    k = int(args.get("classes", 4))
    noise = float(args.get("noise", 1.0))
    g = torch.Generator().manual_seed(int(args.get("seed", 0)))
    centers = torch.randn(k, d, generator=g) * float(args.get("separation", 1.0))
    y = torch.randint(0, k, (n,), generator=g)
    x = centers[y] + noise * torch.randn(n, d, generator=g)
    n_val = int(n * float(args.get("val_fraction", 0.2)))
    return DataBundle(TensorData(x[n_val:], y[n_val:]), TensorData(x[:n_val], y[:n_val]), (d,), k)


class SyntheticImages(Dataset):
    """uint8 images made on the fly from the index (a class pattern plus noise).

    Sized like real image data (3x224x224 by default) without holding it in memory, so it
    exercises the DataLoader path: worker processes, pinned memory, non-blocking copies.
    """

    def __init__(self, n: int, shape: tuple[int, ...], classes: int, offset: int, seed: int):
        self.n, self.shape, self.classes, self.offset = n, shape, classes, offset
        g = torch.Generator().manual_seed(seed)
        c, h, w = shape
        # Low-resolution class patterns, upsampled: learnable, but not from one pixel.
        small = torch.randint(0, 256, (classes, c, 8, 8), generator=g, dtype=torch.uint8)
        self.patterns = torch.nn.functional.interpolate(small.float(), size=(h, w)).to(torch.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.offset + i)
        label = int(torch.randint(0, self.classes, (1,), generator=g))
        noise = torch.randint(-40, 41, self.shape, generator=g, dtype=torch.int16)
        img = (self.patterns[label].to(torch.int16) + noise).clamp_(0, 255).to(torch.uint8)
        return img, torch.tensor(label)


def _synthetic_images(args: dict[str, Any]) -> DataBundle:
    size = int(args.get("size", 224))
    shape = (int(args.get("channels", 3)), size, size)
    k = int(args.get("classes", 10))
    n = int(args.get("samples", 2048))
    n_val = int(n * float(args.get("val_fraction", 0.2)))
    seed = int(args.get("seed", 0))
    train = SyntheticImages(n - n_val, shape, k, offset=n_val, seed=seed)
    val = SyntheticImages(n_val, shape, k, offset=0, seed=seed)
    return DataBundle(train, val, shape, k, scale=1 / 255)


BUILTIN: dict[str, Callable[[dict[str, Any]], DataBundle]] = {
    "digits": _digits,
    "synthetic": _synthetic,
    "synthetic_images": _synthetic_images,
}
assert tuple(BUILTIN) == catalogue.DATA, "a built-in dataset without its catalogue entry"


@functools.lru_cache(maxsize=4)
def _cached_builtin(name: str, frozen_args: str) -> DataBundle:
    # Reused trial actors keep this cache: data is built once per process, not per trial.
    return BUILTIN[name](json.loads(frozen_args))


def import_object(spec: str, search_path: Optional[str] = None) -> Any:
    """Resolve 'package.module:attr', looking in `search_path` too (os.pathsep-joined
    directories, the first first: where the sweep imports its own modules from)."""
    module, _, attr = spec.partition(":")
    for d in reversed((search_path or "").split(os.pathsep)):
        if d and d not in sys.path:
            sys.path.insert(0, d)
    return getattr(importlib.import_module(module), attr)


def import_function(field: str, spec: str, search_path: Optional[str], args: Sequence[str]) -> Any:
    """The user's function `spec` of sweep field `field`, checked to be callable as fn(*args).

    The sweep file's check (tuner.config.functions) reads the source; this one sees the
    object itself, for what the source could not tell (imported names, decorators).
    """
    fn = import_object(spec, search_path)
    wanted = f"fn({', '.join(args)})"
    if not callable(fn):
        raise TypeError(f"{field}: '{spec}' is not callable ({type(fn).__name__}); it must be {wanted}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: let the call tell
        return fn
    try:
        sig.bind(*args)
    except TypeError:
        raise TypeError(f"{field}: '{spec}' cannot be called as {wanted}: its signature is {sig}") from None
    return fn


def load_data(
    data: str, data_args: dict[str, Any], hp: dict[str, Any], search_path: Optional[str] = None
) -> DataBundle:
    """The task's data. User functions get `{**data_args, **hyperparameters}` as config."""
    if ":" not in data:
        return _cached_builtin(data, json.dumps(data_args, sort_keys=True))
    fn = import_function("task.data", data, search_path, ("config",))
    out = fn({**data_args, **hp})
    if isinstance(out, DataBundle):
        return out
    train, val = out
    x0, _ = train[0]
    return DataBundle(train, val, tuple(torch.as_tensor(x0).shape), _num_classes(train, data_args))


def _num_classes(ds: Dataset, data_args: dict[str, Any]) -> Optional[int]:
    """Classes of a dataset's targets, or None when they are not class indices.

    `data_args.num_classes` (null: not classes) or a `num_classes` attribute of the dataset
    say it outright. Otherwise the targets' dtype decides: floating-point (or complex) targets
    are values (regression), None; integer or bool targets are class indices of any shape
    (a label per sample, per token or per pixel), and the classes are their largest + 1.
    """
    if "num_classes" in data_args:
        return None if data_args["num_classes"] is None else int(data_args["num_classes"])
    if hasattr(ds, "num_classes"):
        return None if ds.num_classes is None else int(ds.num_classes)
    tensors = _as_tensors(ds)
    if tensors is not None:
        return _classes_of(tensors[1])
    first = torch.as_tensor(ds[0][1])
    if first.is_floating_point() or first.is_complex():
        return None
    # Last resort: look at every target once. data_args.num_classes avoids it.
    return int(max(int(torch.as_tensor(ds[i][1]).max()) for i in range(len(ds)))) + 1


def _classes_of(y: torch.Tensor) -> Optional[int]:
    if y.is_floating_point() or y.is_complex():
        return None
    return int(y.max()) + 1 if y.numel() else 0


# ----------------------------------------------------------------------------- batches


def _as_tensors(ds: Dataset) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(ds, TensorData):
        return ds.x, ds.y
    if isinstance(ds, torch.utils.data.TensorDataset) and len(ds.tensors) == 2:
        return ds.tensors[0], ds.tensors[1]
    return None


# Batches each DataLoader worker loads ahead (torch's default, set here so that autotune knows
# how many batches a loader holds ready: the buffer it must not time as speed).
PREFETCH_FACTOR = 2
# In-memory data up to this size as float is converted once; larger stays compact (uint8) and
# is converted batch by batch on the device.
PREPARE_ONCE_BYTES = 256 * 2**20


class _Plan:
    """The batch sampler of a split's DataLoader: the index chunks of the current pass."""

    def __init__(self) -> None:
        self.chunks: Sequence[torch.Tensor] = ()

    def __iter__(self) -> Iterator[list[int]]:
        return (chunk.tolist() for chunk in self.chunks)

    def __len__(self) -> int:
        return len(self.chunks)


class Batches:
    """Per-worker batches of one split: whole steps for training, chunks for evaluation.

    In-memory data is moved to the device once and gathered there.
    """

    def __init__(
        self,
        ds: Dataset,
        *,
        device: torch.device,
        rank: int,
        world_size: int,
        seed: int,
        loader_workers: int = 0,
        prepare: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    ):
        self.ds, self.device, self.rank, self.world = ds, device, rank, world_size
        self.loader_workers = loader_workers
        self.sampler = DistributedSampler(
            ds, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=False
        )
        tensors = _as_tensors(ds)
        if tensors is not None:
            x = tensors[0].to(device)
            if prepare is not None and x.numel() * 4 <= PREPARE_ONCE_BYTES:
                # Convert the whole split once instead of every batch every epoch (the feed's
                # prepare then sees float input and passes it through).
                x = prepare(x)
            tensors = (x, tensors[1].to(device))
        self.tensors = tensors
        self.pin = device.type == "cuda"
        self._plan = _Plan()
        self._loader: Optional[DataLoader] = None

    def train_steps(self, epoch: int, per_rank_batch: int) -> Iterator[tuple[torch.Tensor, ...]]:
        """The epoch's steps in order: `(x, y)` of up to `per_rank_batch` samples each."""
        self.sampler.set_epoch(epoch)
        order = torch.tensor(list(self.sampler), dtype=torch.long)
        return self._batches(self._on_data_device(order).split(per_rank_batch))

    def eval_chunks(self, batch: int) -> Iterator[tuple[torch.Tensor, ...]]:
        """This worker's share of the split, unshuffled and unpadded (exact metrics).

        Every rank gets the same number of chunks (of at most `batch`), even when the shares
        differ by one sample: a sharded (FSDP) model's forward is a collective.
        """
        order = torch.arange(self.rank, len(self.ds), self.world)
        chunks = max(1, -(-math.ceil(len(self.ds) / self.world) // batch))
        return self._batches(self._on_data_device(order).tensor_split(chunks))

    def _on_data_device(self, order: torch.Tensor) -> torch.Tensor:
        """Indices where in-memory data lives: one copy per epoch, not one per step."""
        return order.to(self.tensors[0].device) if self.tensors is not None else order

    def _batches(self, chunks: Sequence[torch.Tensor]) -> Iterator[tuple[torch.Tensor, ...]]:
        if self.tensors is not None:
            x, y = self.tensors
            for idx in chunks:
                yield x[idx], y[idx]
            return
        self._plan.chunks = chunks
        if self._loader is None:
            # One loader per split for the whole trial: its worker processes start once and
            # are kept between epochs and between training and evaluation, instead of being
            # started inside every timed epoch; each pass reads the plan as it is then.
            self._loader = DataLoader(
                self.ds,
                batch_sampler=self._plan,
                num_workers=self.loader_workers,
                prefetch_factor=PREFETCH_FACTOR if self.loader_workers > 0 else None,
                pin_memory=self.pin,  # pinned pages: the feed's non_blocking copies are async
                persistent_workers=self.loader_workers > 0,
            )
        yield from self._loader

    def buffered(self) -> int:
        """How many batches the loader's workers hold ready at most (none for in-memory data)."""
        return 0 if self.tensors is not None else PREFETCH_FACTOR * self.loader_workers

    def workers(self) -> int:
        """The loader's worker processes (none for in-memory data: gathered directly)."""
        return 0 if self.tensors is not None else self.loader_workers

    def close(self) -> None:
        """Stop the loader's worker processes (dropping the last reference to it does)."""
        self._loader = None

    def __len__(self) -> int:
        return len(self.sampler)
