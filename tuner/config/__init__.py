"""The sweep file: a typed, validated `SweepConfig` (defaults < YAML < CLI flags).

Imports neither Ray nor torch, so `tuner validate` answers at once and a bad file is refused
before anything heavy starts. sections: the fields; load: YAML and overrides in, YAML out;
schema: the docs' field reference and the JSON Schema; flags: the CLI flags that override fields.
Modules of this package import each other directly, never this face, so it re-exports them
without a circle.
"""

from tuner.config.base import MAX_SEED, MAX_TRIALS, OBJECTIVES
from tuner.config.load import load_sweep, parse_sweep, read_yaml, set_dotted, settled, to_yaml
from tuner.config.schedule import NotifySection, ScheduleSection
from tuner.config.schema import json_schema, reference_markdown
from tuner.config.sections import (
    FailureSection,
    ResourcesSection,
    SearchSection,
    SweepConfig,
    TaskSection,
    TrainingSection,
    amp_from_yaml,
)
from tuner.errors import ConfigError

__all__ = [
    "MAX_SEED",
    "MAX_TRIALS",
    "OBJECTIVES",
    "ConfigError",
    "FailureSection",
    "NotifySection",
    "ResourcesSection",
    "ScheduleSection",
    "SearchSection",
    "SweepConfig",
    "TaskSection",
    "TrainingSection",
    "amp_from_yaml",
    "json_schema",
    "load_sweep",
    "parse_sweep",
    "read_yaml",
    "reference_markdown",
    "set_dotted",
    "settled",
    "to_yaml",
]
