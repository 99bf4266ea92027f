"""A trial's weights outside training: plain state dicts, the model rebuilt, saved as files.

The torch half of exporting (tuner.view.export decides which trial and where): weights
without wrapper prefixes, a built-in or `task.model` model built again from a trial's
configuration, and the files of each export format.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch
from torch import nn

from tuner.trial.data import load_data
from tuner.trial.models import build_model

FILES = {"state_dict": "model.pt", "torchscript": "model.ts.pt", "onnx": "model.onnx"}


def plain_state_dict(weights: dict[str, Any]) -> dict[str, Any]:
    """`weights` on the CPU without the prefixes wrappers add to every key (DDP's `module.`,
    torch.compile's `_orig_mod.`)."""
    out = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in weights.items()}
    while out:
        for prefix in ("module.", "_orig_mod."):
            if all(k.startswith(prefix) for k in out):
                out = {k[len(prefix) :]: v for k, v in out.items()}
                break
        else:
            return out
    return out


def rebuild(
    model: str, data: str, data_args: dict[str, Any], hp: dict[str, Any], weights: dict[str, Any]
) -> tuple[nn.Module, torch.Tensor]:
    """(the model `task.model` builds for configuration `hp`, `weights` loaded, in eval mode;
    one input as the model sees it, for tracing). User functions come from the current
    directory, as they did for the sweep started there."""
    bundle = load_data(data, data_args, hp, os.getcwd())
    net = build_model(model, hp, bundle.input_shape, bundle.num_classes, os.getcwd())
    net.load_state_dict(weights)
    first = bundle.val[0] if len(bundle.val) else bundle.train[0]  # type: ignore[arg-type]
    return net.eval(), bundle.prepare(torch.as_tensor(first[0]).unsqueeze(0))


def load_into(model: nn.Module, weights: dict[str, Any]) -> nn.Module:
    model.load_state_dict(weights)
    return model.eval()


def save_formats(
    directory: str, weights: dict[str, Any], fmt: str, built: Optional[tuple[nn.Module, Any]]
) -> None:
    """model.pt (always), and the model as `fmt` (torchscript, onnx) when built."""
    torch.save(weights, os.path.join(directory, FILES["state_dict"]))
    if built is None or fmt == "state_dict":
        return
    path = os.path.join(directory, FILES[fmt])
    if fmt == "torchscript":
        torch.jit.save(_scripted(*built), path)
    else:  # one file (no external data); any batch size; torch's exporter kept quiet
        model, example = built
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
