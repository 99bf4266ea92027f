"""Mixed precision as objects, so the loop body is the same with AMP on or off.

fp16 autocasts and scales the loss with a GradScaler (fp16 gradients underflow without it);
bf16 autocasts without a scaler (it has fp32's exponent range); off is a `nullcontext` and a
disabled scaler whose scale/unscale_/step/update pass straight through.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Optional

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def native_bf16(device: torch.device) -> bool:
    """bf16 in hardware: compute capability 8.0 (Ampere) and later. Not
    `torch.cuda.is_bf16_supported()`, which by default also counts the emulation on older GPUs
    (V100, T4), where bf16 runs far slower than fp16."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8


def resolve_amp(mode: str, device: torch.device) -> str:
    """`auto` -> bf16 on GPUs with native bf16, fp16 on older GPUs, off on CPU."""
    if mode == "auto":
        if device.type != "cuda":
            return "off"
        return "bf16" if native_bf16(device) else "fp16"
    if mode == "fp16" and device.type != "cuda":
        raise ValueError("training.amp: fp16 needs a CUDA GPU; use bf16 or off on CPU")
    return mode


@dataclass
class Amp:
    """Autocast context factory plus the matching GradScaler."""

    mode: str
    device_type: str
    dtype: Optional[torch.dtype]
    scaler: torch.amp.GradScaler
    eval_fp32: bool = False  # training.eval_precision: fp32

    def autocast(self) -> AbstractContextManager[None]:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def eval_autocast(self) -> AbstractContextManager[None]:
        """Evaluation's forward pass: as training's, or in fp32 (`training.eval_precision`)."""
        return nullcontext() if self.eval_fp32 else self.autocast()


def make_amp(mode: str, device: torch.device, eval_precision: str = "amp") -> Amp:
    """The Amp for `training.amp` on `device` (see resolve_amp) and `training.eval_precision`."""
    resolved = resolve_amp(mode, device)
    dtype = DTYPES.get(resolved)
    scaler = torch.amp.GradScaler(device.type, enabled=resolved == "fp16")
    return Amp(resolved, device.type, dtype, scaler, eval_fp32=eval_precision == "fp32")
