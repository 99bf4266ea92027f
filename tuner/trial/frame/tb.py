"""TensorBoard event files: scalars, text and HParams, without TensorFlow or torch.

Only rank 0 of a trial writes scalars (`EventWriter`); other ranks get a `NullWriter`, so the
loop never branches on rank. The HParams records are written by the driver (see
`tuner.driver.callbacks`): the experiment (hyperparameter domains, metric tags) once at the sweep
root, a session start when a trial starts and its end status when it ends, so running,
stopped and failed trials all appear in the HParams table.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any, Optional, Union

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tuner.sweepdir import finite

Number = Union[int, float]


class EventWriter:
    """Appends events to one new event file in `logdir` (a TensorBoard run)."""

    def __init__(self, logdir: str, suffix: str = ""):
        # A background thread writes; flush_secs bounds how stale a live view can be.
        self._writer = EventFileWriter(logdir, max_queue_size=64, flush_secs=5, filename_suffix=suffix)

    def scalars(self, values: dict[str, Any], step: int) -> None:
        self.summary(scalars_summary(values), step)

    def text(self, tag: str, message: str, step: int) -> None:
        tensor = TensorProto(
            dtype="DT_STRING",
            string_val=[message.encode()],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        self.summary(Summary(value=[Summary.Value(tag=tag, metadata=meta, tensor=tensor)]), step)

    def summary(self, summary: Summary, step: int = 0) -> None:
        self._writer.add_event(Event(summary=summary, wall_time=time.time(), step=step))

    def close(self) -> None:
        self._writer.close()


class NullWriter:
    """What ranks other than 0 (and disabled logging) write to: nothing."""

    def scalars(self, values: dict[str, Any], step: int) -> None: ...
    def text(self, tag: str, message: str, step: int) -> None: ...
    def summary(self, summary: Summary, step: int = 0) -> None: ...
    def close(self) -> None: ...


def scalars_summary(values: dict[str, Any], descriptions: Optional[dict[str, str]] = None) -> Summary:
    """Numbers as scalars (other values are left out); `descriptions`: what a tag means,
    shown beside its chart (TensorBoard keeps the first it reads of each tag)."""
    out = Summary()
    for tag, raw in values.items():
        v = _as_float(raw)
        if v is not None:
            about = (descriptions or {}).get(tag)
            meta = scalar_metadata.create_summary_metadata(tag, about) if about else None
            out.value.append(Summary.Value(tag=tag, simple_value=v, metadata=meta))
    return out


def _as_float(v: Any) -> Optional[float]:
    """A number as a float (inf for an integer past a float's range); None for the rest."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        return float(v)
    except OverflowError:  # an integer such as 10**400
        return math.inf if v > 0 else -math.inf


# ----------------------------------------------------------------------------- HParams

_STATUS = {
    "success": api_pb2.STATUS_SUCCESS,
    "failure": api_pb2.STATUS_FAILURE,
    "running": api_pb2.STATUS_RUNNING,
    "unknown": api_pb2.STATUS_UNKNOWN,
}


def _hparams_summary(tag: str, data: plugin_data_pb2.HParamsPluginData) -> Summary:
    data.version = metadata.PLUGIN_DATA_VERSION
    return Summary(
        value=[
            Summary.Value(
                tag=tag,
                metadata=metadata.create_summary_metadata(data),
                tensor=metadata.NULL_TENSOR,
            )
        ]
    )


def hparam_value(v: Any) -> Union[str, float, bool]:
    """A value TensorBoard can show: numbers, strings and bools as they are, else str."""
    if isinstance(v, bool) or isinstance(v, str):
        return v
    if finite(v):
        return float(v)
    return str(v)


def experiment_summary(
    domains: dict[str, Union[tuple[Number, Number], list[Any], None]],
    metric_tags: Iterable[str],
    labels: Optional[dict[str, tuple[str, str]]] = None,
) -> Summary:
    """Hyperparameter infos (interval or discrete domain) and the metric columns; `labels`:
    a column's (header, description) where it is not its tag."""
    infos = []
    for name, domain in domains.items():
        info = api_pb2.HParamInfo(name=name)
        if isinstance(domain, tuple):
            info.type = api_pb2.DATA_TYPE_FLOAT64
            info.domain_interval.min_value = float(domain[0])
            info.domain_interval.max_value = float(domain[1])
        elif isinstance(domain, list):
            values = [hparam_value(v) for v in domain]
            info.type = _data_type(values)
            for v in values:
                item = info.domain_discrete.values.add()
                if isinstance(v, bool):
                    item.bool_value = v
                elif isinstance(v, float):
                    item.number_value = v
                else:
                    item.string_value = v
        infos.append(info)
    experiment = api_pb2.Experiment(
        hparam_infos=infos,
        metric_infos=[
            api_pb2.MetricInfo(
                name=api_pb2.MetricName(tag=t),
                display_name=(labels or {}).get(t, ("", ""))[0],
                description=(labels or {}).get(t, ("", ""))[1],
            )
            for t in metric_tags
        ],
        time_created_secs=time.time(),
    )
    return _hparams_summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment))


def _data_type(values: list[Any]) -> int:
    if all(isinstance(v, bool) for v in values):
        return api_pb2.DATA_TYPE_BOOL
    if all(isinstance(v, float) for v in values):
        return api_pb2.DATA_TYPE_FLOAT64
    return api_pb2.DATA_TYPE_STRING


def session_start_summary(hparams: dict[str, Any]) -> Summary:
    """One trial's hyperparameter values (a row of the HParams table)."""
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name, raw in hparams.items():
        v = hparam_value(raw)
        if isinstance(v, bool):
            start.hparams[name].bool_value = v
        elif isinstance(v, float):
            start.hparams[name].number_value = v
        else:
            start.hparams[name].string_value = v
    return _hparams_summary(
        metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start)
    )


def session_end_summary(status: str) -> Summary:
    """How a trial ended: success, failure, running or unknown."""
    end = plugin_data_pb2.SessionEndInfo(status=_STATUS[status], end_time_secs=time.time())
    return _hparams_summary(
        metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end)
    )
