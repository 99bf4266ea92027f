"""Regression through tuner's hooks (search_spaces/regression.yaml names these functions).

sklearn's diabetes data (442 patients, 10 measurements, a disease-progression score to
predict; it ships with scikit-learn), a small MLP, mean squared error as the loss, and MSE and
MAE as the metrics (reported as val_mse and val_mae).

The targets are floats, so tuner passes `num_classes=None` to `model` and has no default
loss or metrics for them: `loss` and `metrics` say what to optimise and measure. Metrics are
means over the batch, which tuner weights by batch size over every evaluation batch and
worker: the mean squared error is such a mean, its square root (RMSE) is not, so the sweep
reports val_mse (RMSE = sqrt(val_mse)).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

# The targets' scale (mean and standard deviation of the score over all 442 patients): the
# network predicts in standard units and `Rescale` turns that into the score's own units.
TARGET_MEAN, TARGET_STD = 152.1, 77.0


def data(config: dict[str, Any]) -> tuple[TensorDataset, TensorDataset]:
    """A fixed 75/25 split; inputs standardised with the training split's statistics, targets
    float32 of shape (N, 1), like the model's output."""
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    x, y = load_diabetes(return_X_y=True)
    xtr, xva, ytr, yva = train_test_split(x, y, test_size=0.25, random_state=0)
    mean, std = xtr.mean(0), xtr.std(0)

    def split(xs: Any, ys: Any) -> TensorDataset:
        inputs = torch.tensor((xs - mean) / std, dtype=torch.float32)
        return TensorDataset(inputs, torch.tensor(ys, dtype=torch.float32).unsqueeze(1))

    return split(xtr, ytr), split(xva, yva)


class Rescale(nn.Module):
    """Standard units -> the target's units (a fixed affine map, no parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * TARGET_STD + TARGET_MEAN


def model(config: dict[str, Any], input_shape: tuple[int, ...], num_classes: Optional[int]) -> nn.Module:
    """An MLP of `depth` hidden layers of `width` units and one output."""
    width, depth = int(config.get("width", 64)), int(config.get("depth", 1))
    layers: list[nn.Module] = []
    d = input_shape[0]
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, 1), Rescale())


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the batch."""
    return F.mse_loss(output, target)


def metrics(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Means over the batch: squared and absolute error (reported as val_mse, val_mae)."""
    err = output - target
    return {"mse": err.pow(2).mean(), "mae": err.abs().mean()}
