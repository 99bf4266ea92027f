"""The sweep file: a typed, validated `SweepConfig` (defaults < YAML < CLI flags).

Imports neither Ray nor torch, so `tuner validate` answers at once and a bad file is refused
before anything heavy starts. Modules of this package import each other directly, never this
face, so it can re-export them without a circle.
"""

from tuner.config.sections import (
    BUILTIN_DATA,
    BUILTIN_MODELS,
    MODEL_PARAMS,
    OBJECTIVES,
    OPTIMIZERS,
    ConfigError,
    FailureSection,
    ResourcesSection,
    ScheduleSection,
    SearchSection,
    SweepConfig,
    TaskSection,
    TrainingSection,
    amp_from_yaml,
    check_importable,
    json_schema,
    load_sweep,
    parse_sweep,
    read_yaml,
    reference_markdown,
    set_dotted,
    to_yaml,
)

__all__ = [
    "BUILTIN_DATA",
    "BUILTIN_MODELS",
    "MODEL_PARAMS",
    "OBJECTIVES",
    "OPTIMIZERS",
    "ConfigError",
    "FailureSection",
    "ResourcesSection",
    "ScheduleSection",
    "SearchSection",
    "SweepConfig",
    "TaskSection",
    "TrainingSection",
    "amp_from_yaml",
    "check_importable",
    "json_schema",
    "load_sweep",
    "parse_sweep",
    "read_yaml",
    "reference_markdown",
    "set_dotted",
    "to_yaml",
]
