"""A trial's weights outside training: the model rebuilt and saved in another format.

The torch half of exporting (tuner.view.export decides which trial and where, and copies
the plain state dict without torch): a built-in or `task.model` model built again from a
trial's configuration with its best weights, and the files of torchscript and onnx.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from tuner.sweepdir import EXPORT_FILES
from tuner.trial.loop.data import load_data
from tuner.trial.loop.models import build_model


def rebuild(
    model: str,
    data: str,
    data_args: dict[str, Any],
    hp: dict[str, Any],
    weights_file: str,
    code_dirs: Sequence[str] = (),
) -> tuple[nn.Module, torch.Tensor]:
    """(the model `task.model` builds for configuration `hp`, the weights loaded, in eval
    mode; one input as the model sees it, for tracing). User functions come from `code_dirs`
    (the sweep's: SweepConfig.code_dirs), else the current directory."""
    where = os.pathsep.join(code_dirs) or os.getcwd()
    bundle = load_data(data, data_args, hp, where)
    net = build_model(model, hp, bundle.input_shape, bundle.num_classes, where)
    net.load_state_dict(torch.load(weights_file, map_location="cpu", weights_only=True))
    first = bundle.val[0] if len(bundle.val) else bundle.train[0]  # type: ignore[arg-type]
    return net.eval(), bundle.prepare(torch.as_tensor(first[0]).unsqueeze(0))


def load_into(model: nn.Module, weights_file: str) -> nn.Module:
    model.load_state_dict(torch.load(weights_file, map_location="cpu", weights_only=True))
    return model.eval()


def save_format(directory: str, fmt: str, built: tuple[nn.Module, Any]) -> None:
    """The model as `fmt` (torchscript, onnx) in `directory`."""
    path = os.path.join(directory, EXPORT_FILES[fmt])
    if fmt == "torchscript":
        torch.jit.save(_scripted(*built), path)
        return
    model, example = built  # one file (no external data); any batch size; the exporter quiet
    torch.onnx.export(
        model,
        (torch.cat([example, example]),),  # batch 2: a batch of 1 would be taken as fixed
        path,
        dynamo=True,
        input_names=["input"],
        output_names=["output"],
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        external_data=False,
        verbose=False,
    )


def _scripted(model: nn.Module, example: Any) -> Any:
    """TorchScript of the model: scripted, or traced on one input where scripting fails."""
    try:
        return torch.jit.script(model)
    except Exception:  # noqa: BLE001 - what scripting cannot read, tracing may run
        with torch.no_grad():
            return torch.jit.trace(model, example)
