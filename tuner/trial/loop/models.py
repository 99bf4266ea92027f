"""Model families sized by hyperparameters, and user models by 'package.module:function'.

Built-ins read their sizes from the trial's hyperparameters; names, defaults and bounds are
in tuner.catalogue.MODELS:
- mlp: width, depth hidden layers, dropout
- cnn: channels in the first block, doubling per block; blocks; dropout
- vit: patch_size, width, depth, heads, mlp_ratio, dropout
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from tuner.catalogue import MODELS as CATALOGUE
from tuner.trial.loop.data import import_function

ModelFn = Callable[[dict[str, Any], tuple[int, ...], Optional[int]], nn.Module]


def _size(hp: dict[str, Any], model: str, name: str) -> Any:
    """The trial's value of a built-in model's size, or the catalogue's default, as its type."""
    param = CATALOGUE[model][name]
    return param.kind(hp.get(name, param.default))


def mlp(hp: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    width, depth = _size(hp, "mlp", "width"), _size(hp, "mlp", "depth")
    dropout = _size(hp, "mlp", "dropout")
    d = 1
    for s in input_shape:
        d *= s
    layers: list[nn.Module] = [nn.Flatten()]
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        d = width
    layers.append(nn.Linear(d, num_classes))
    return nn.Sequential(*layers)


def cnn(hp: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 3:
        raise ValueError(f"task.model: cnn needs image inputs (C, H, W), got shape {input_shape}")
    channels, blocks = _size(hp, "cnn", "channels"), _size(hp, "cnn", "blocks")
    dropout = _size(hp, "cnn", "dropout")
    c_in, size = input_shape[0], min(input_shape[1:])
    layers: list[nn.Module] = []
    for b in range(blocks):
        c_out = channels * 2**b
        layers += [
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        ]
        if size >= 4:  # halve while there is room; tiny inputs (digits: 8x8) stop at 2x2
            layers.append(nn.MaxPool2d(2))
            size //= 2
        c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(c_in, num_classes)]
    return nn.Sequential(*layers)


class _Block(nn.Module):
    """Pre-norm transformer block; attention through scaled_dot_product_attention."""

    def __init__(self, width: int, heads: int, mlp_ratio: float, dropout: float):
        super().__init__()
        if width % heads:
            raise ValueError(f"vit: width {width} is not divisible by heads {heads}")
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        hidden = int(width * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, width)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, c // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, n, c)))
        return x + self.drop(self.mlp(self.norm2(x)))


class ViT(nn.Module):
    """Vision Transformer (Dosovitskiy et al., 2021): patches -> transformer -> class token."""

    def __init__(self, hp: dict[str, Any], input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"task.model: vit needs image inputs (C, H, W), got {input_shape}")
        c, h, w = input_shape
        patch = _size(hp, "vit", "patch_size")
        if h % patch or w % patch:
            raise ValueError(f"vit: image {h}x{w} is not divisible by patch_size {patch}")
        width, depth = _size(hp, "vit", "width"), _size(hp, "vit", "depth")
        heads, ratio = _size(hp, "vit", "heads"), _size(hp, "vit", "mlp_ratio")
        dropout = _size(hp, "vit", "dropout")
        self.patch = nn.Conv2d(c, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, (h // patch) * (w // patch) + 1, width) * 0.02)
        self.blocks = nn.Sequential(*[_Block(width, heads, ratio, dropout) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, num_classes)

    def fsdp_units(self) -> list[nn.Module]:
        """What FSDP shards one by one: the transformer blocks (the rest goes with the root)."""
        return list(self.blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


MODELS: dict[str, ModelFn] = {"mlp": mlp, "cnn": cnn, "vit": ViT}
assert MODELS.keys() == CATALOGUE.keys(), "a built-in model without its catalogue entry"


def build_model(
    name: str,
    hp: dict[str, Any],
    input_shape: tuple[int, ...],
    num_classes: Optional[int],
    search_path: Optional[str] = None,
) -> nn.Module:
    """A built-in family by name, or the user's `fn(config, input_shape, num_classes)`
    (num_classes None: the targets are not class indices)."""
    if ":" not in name:
        if num_classes is None:
            raise ValueError(
                f"task.model: the built-in {name} classifies, but the targets are not class "
                "indices (floating-point); name your own model ('package.module:function')"
            )
        fn: ModelFn = MODELS[name]
    else:
        fn = import_function("task.model", name, search_path, ("config", "input_shape", "num_classes"))
    model = fn(hp, tuple(input_shape), num_classes)
    if not isinstance(model, nn.Module):
        raise TypeError(f"task.model: {name} returned {type(model).__name__}, not nn.Module")
    return model
