"""What a trial optimises and measures: the loss and the evaluation metrics.

tuner's defaults (cross-entropy and accuracy over class dimension 1, torch's convention: a
label per sample, per token or per pixel), or the user's hooks named in the sweep file:
`task.loss: fn(output, target) -> scalar` (the mean over the batch) and `task.metrics:
fn(output, target) -> {name: scalar}` (means over the batch). The loop weights both by batch
size, so micro-batches, evaluation chunks and ranks add up to the whole batch's mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from tuner.trial.loop.data import import_function

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
MetricsFn = Callable[[torch.Tensor, torch.Tensor], dict[str, Any]]
HOOK_ARGS = ("output", "target")


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The default loss: mean cross-entropy of class-index targets."""
    return F.cross_entropy(output, target)


def accuracy(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """The default metric for class targets: `acc`, the share of argmax hits."""
    return {"acc": (output.argmax(1) == target).float().mean()}


def no_metrics(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """The default for targets that are not classes: val_loss alone."""
    return {}


@dataclass(frozen=True)
class Objective:
    """A trial's loss and metrics, each checked as it is called."""

    loss_fn: LossFn
    metrics_fn: MetricsFn

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The batch's mean loss, a scalar tensor."""
        value = self.loss_fn(output, target)
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            what = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"task.loss: returned {what}, not a scalar tensor (the mean over the batch)")
        return value

    def metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """The batch's mean metrics by name, as float64 scalars on the output's device."""
        values = self.metrics_fn(output, target)
        if not isinstance(values, dict):
            raise ValueError(f"task.metrics: returned {type(values).__name__}, not a dict of name: value")
        out: dict[str, torch.Tensor] = {}
        for name, v in values.items():
            if not isinstance(name, str) or not name or name == "loss":
                raise ValueError(
                    f"task.metrics: a metric named {name!r}: names are non-empty strings, and "
                    "'loss' is tuner's own (val_loss)"
                )
            t = torch.as_tensor(v.detach() if isinstance(v, torch.Tensor) else v, device=output.device)
            if t.numel() != 1:
                raise ValueError(f"task.metrics: '{name}' has shape {tuple(t.shape)}, not a scalar")
            out[name] = t.reshape(()).to(torch.float64)
        return out


def make_objective(
    loss: Optional[str], metrics: Optional[str], num_classes: Optional[int], search_path: Optional[str]
) -> Objective:
    """The trial's loss and metrics: the named hooks, else tuner's defaults for its targets."""
    classes = num_classes is not None
    if loss is not None:
        loss_fn: LossFn = import_function("task.loss", loss, search_path, HOOK_ARGS)
    elif classes:
        loss_fn = cross_entropy
    else:
        raise ValueError(
            "task.loss: the targets are not class indices (floating-point), so the default "
            "cross-entropy does not apply; name a loss function fn(output, target)"
        )
    if metrics is not None:
        metrics_fn: MetricsFn = import_function("task.metrics", metrics, search_path, HOOK_ARGS)
    else:
        metrics_fn = accuracy if classes else no_metrics
    return Objective(loss_fn, metrics_fn)
