"""Reading TensorBoard event files back (what TensorBoard itself will load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata


def load_run(path: Path) -> EventAccumulator:
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(path: Path) -> dict[str, list[float]]:
    acc = load_run(path)
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def steps(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Each scalar tag's (step, value) pairs, in the order the run's files hold them."""
    acc = load_run(path)
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def hparams(path: Path) -> dict[str, Any]:
    """{'experiment'|'session_start'|'session_end': parsed plugin data} found in the run."""
    acc = load_run(path)
    try:
        content = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    except KeyError:  # no HParams data in this run
        content = {}
    out: dict[str, Any] = {}
    for tag, raw in content.items():
        if tag == metadata.EXPERIMENT_TAG:
            out["experiment"] = metadata.parse_experiment_plugin_data(raw)
        elif tag == metadata.SESSION_START_INFO_TAG:
            out["session_start"] = metadata.parse_session_start_info_plugin_data(raw)
        elif tag == metadata.SESSION_END_INFO_TAG:
            out["session_end"] = metadata.parse_session_end_info_plugin_data(raw)
    return out
