"""Library-neutral search-space parameters and their converters.

A sweep file describes each hyperparameter once, in these neutral types. Each search
library gets the space converted at the edge (`to_tune`, `to_configspace`, `grid_values`),
and an algorithm that cannot express a type refuses it at validation time (the kinds its
record takes: tuner.config.algorithms). This module imports neither Ray nor torch: validating a file must not
pay their start-up.

Integer bounds are inclusive (`randint 1..3` draws 1, 2 or 3), unlike Ray Tune's `randint`,
whose upper bound is exclusive; the converters translate.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

Scalar = Union[bool, int, float, str]


class _Param(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    when: Optional[dict[str, Union[Scalar, list[Scalar]]]] = Field(
        None,
        description="Search this parameter only where every named parameter has the given "
        "value (or one of the listed values); elsewhere it is absent and the trial uses its "
        "default.",
    )

    @property
    def kind(self) -> str:
        return self.type  # type: ignore[attr-defined]

    @model_validator(mode="after")
    def _when_shape(self) -> _Param:
        for parent, wanted in (self.when or {}).items():
            if isinstance(wanted, list) and not wanted:
                raise ValueError(f"when.{parent}: must list at least one value")
            for v in wanted if isinstance(wanted, list) else [wanted]:
                _finite(v, f"when.{parent}: ")
        if self.when == {}:
            raise ValueError("when: must name at least one parameter")
        return self


class _Range(_Param):
    model_config = ConfigDict(allow_inf_nan=False)  # `high: .inf` is no bound

    @model_validator(mode="before")
    @classmethod
    def _no_bool_bounds(cls, raw: Any) -> Any:
        for end in ("low", "high"):
            if isinstance(raw, dict) and isinstance(raw.get(end), bool):
                raise ValueError(f"{end}: must be a number, not {str(raw[end]).lower()}")
        return raw

    @model_validator(mode="after")
    def _ordered(self) -> _Range:
        if not self.low < self.high:  # type: ignore[attr-defined]
            raise ValueError(f"high: must be > low for {self.kind}")
        if self.kind.startswith("log") and self.low <= 0:  # type: ignore[attr-defined]
            raise ValueError(f"low: must be > 0 for {self.kind}")
        return self


class Uniform(_Range):
    """A float drawn uniformly from [low, high]."""

    type: Literal["uniform"]
    low: float = Field(description="Lower bound (inclusive).")
    high: float = Field(description="Upper bound.")


class LogUniform(_Range):
    """A float drawn uniformly in log space from [low, high]; low must be > 0."""

    type: Literal["loguniform"]
    low: float = Field(description="Lower bound (inclusive, > 0).")
    high: float = Field(description="Upper bound.")


class RandInt(_Range):
    """An integer drawn uniformly from low..high, both inclusive."""

    type: Literal["randint"]
    low: int = Field(description="Smallest value (inclusive).")
    high: int = Field(description="Largest value (inclusive).")


class LogRandInt(_Range):
    """An integer drawn log-uniformly from low..high, both inclusive; low must be > 0."""

    type: Literal["lograndint"]
    low: int = Field(description="Smallest value (inclusive, > 0).")
    high: int = Field(description="Largest value (inclusive).")


class _Values(_Param):
    values: list[Scalar] = Field(min_length=1, description="The values, in order.")

    @model_validator(mode="after")
    def _distinct(self) -> _Values:
        if len({(type(v), v) for v in self.values}) != len(self.values):
            raise ValueError("values: must be distinct")
        for v in self.values:
            _finite(v, "values: ")
        return self


class Choice(_Values):
    """One of the listed values, drawn uniformly (a categorical for model-based searchers)."""

    type: Literal["choice"]


class Grid(_Values):
    """Every listed value is tried (grid search: every combination; random: in turn)."""

    type: Literal["grid"]


class Fixed(BaseModel):
    """A value every trial gets unchanged (written in the file as a bare scalar)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: Scalar

    @model_validator(mode="after")
    def _finite_value(self) -> Fixed:
        _finite(self.value)
        return self

    @property
    def kind(self) -> str:
        return "fixed"


def _finite(value: Scalar, field: str = "") -> None:
    # Scalar's float member takes inf and nan (allow_inf_nan reports them against the union).
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{field}must be a finite number, not {value}")


def _param_tag(raw: Any) -> str:
    if isinstance(raw, dict):
        return str(raw.get("type", "<missing>"))
    if isinstance(raw, Fixed):
        return "fixed"
    if isinstance(raw, BaseModel):
        return raw.type  # type: ignore[attr-defined]
    return "fixed"


class _FixedInput(Fixed):
    @model_validator(mode="before")
    @classmethod
    def _wrap(cls, raw: Any) -> Any:
        if isinstance(raw, (bool, int, float, str)):
            return {"value": raw}
        if isinstance(raw, (list, tuple)):
            raise ValueError("a list is not a parameter; write {type: choice, values: [...]}")
        return raw


Param = Annotated[
    Union[
        Annotated[Uniform, Tag("uniform")],
        Annotated[LogUniform, Tag("loguniform")],
        Annotated[RandInt, Tag("randint")],
        Annotated[LogRandInt, Tag("lograndint")],
        Annotated[Choice, Tag("choice")],
        Annotated[Grid, Tag("grid")],
        Annotated[_FixedInput, Tag("fixed")],
    ],
    Discriminator(
        _param_tag,
        custom_error_type="unknown_param_type",
        custom_error_message=(
            "unknown parameter type (valid: uniform, loguniform, randint, lograndint, "
            "choice, grid, or a bare value)"
        ),
    ),
]
"""A parameter as written in `search.params`: a `{type: ...}` mapping or a bare value."""

ParamT = Union[Uniform, LogUniform, RandInt, LogRandInt, Choice, Grid, Fixed]

KINDS = ("uniform", "loguniform", "randint", "lograndint", "choice", "grid", "fixed")


def values_of(p: ParamT) -> list[Scalar] | None:
    """The finite value set of a parameter, or None for a continuous range."""
    if isinstance(p, Fixed):
        return [p.value]
    if isinstance(p, (Choice, Grid)):
        return list(p.values)
    if isinstance(p, (RandInt, LogRandInt)) and p.high - p.low < 16:
        return list(range(p.low, p.high + 1))
    return None


def allows(p: ParamT, value: Any) -> bool:
    """Whether `value` is one the parameter can take: one of its values, or a number of its
    kind within its range."""
    if isinstance(value, bool) and not isinstance(p, (Fixed, Choice, Grid)):
        return False
    if isinstance(p, (RandInt, LogRandInt)):
        return isinstance(value, int) and p.low <= value <= p.high
    if isinstance(p, (Uniform, LogUniform)):
        return isinstance(value, (int, float)) and p.low <= value <= p.high
    return any(value == v and type(value) is type(v) for v in values_of(p) or [])


def extremes(p: ParamT) -> list[Scalar]:
    """The values that validating a parameter checks: all of a finite set, else its bounds."""
    listed = values_of(p)
    if listed is not None:
        return listed
    return [p.low, p.high]  # type: ignore[union-attr]


def grid_values(p: ParamT, points: int) -> list[Scalar]:
    """Values grid search tries: the listed ones, or `points` spread over a range.

    Log types are spread evenly in log space; integer ranges are rounded and de-duplicated,
    and small integer ranges (< 16 values) are tried exhaustively.
    """
    listed = values_of(p)
    if listed is not None:
        return listed
    assert isinstance(p, (Uniform, LogUniform, RandInt, LogRandInt))
    if points == 1:
        fractions = [0.5]
    else:
        fractions = [i / (points - 1) for i in range(points)]
    if isinstance(p, (LogUniform, LogRandInt)):
        lo, hi = math.log(p.low), math.log(p.high)
        raw = [math.exp(lo + f * (hi - lo)) for f in fractions]
    else:
        raw = [p.low + f * (p.high - p.low) for f in fractions]
    if isinstance(p, (RandInt, LogRandInt)):
        return list(dict.fromkeys(int(round(v)) for v in raw))
    return [float(f"{v:.6g}") for v in raw]


def grid_size(params: dict[str, ParamT], points: int) -> int:
    """Number of trials a full grid over `params` runs."""
    return math.prod(len(grid_values(p, points)) for p in params.values())


def to_tune(p: ParamT) -> Any:
    """Convert to a Ray Tune domain (imported lazily)."""
    from ray import tune

    if isinstance(p, Fixed):
        return p.value
    if isinstance(p, Uniform):
        return tune.uniform(p.low, p.high)
    if isinstance(p, LogUniform):
        return tune.loguniform(p.low, p.high)
    if isinstance(p, RandInt):
        return tune.randint(p.low, p.high + 1)  # Tune's upper bound is exclusive
    if isinstance(p, LogRandInt):
        return tune.lograndint(p.low, p.high + 1)
    if isinstance(p, Choice):
        return tune.choice(list(p.values))
    if isinstance(p, Grid):
        return tune.grid_search(list(p.values))
    raise TypeError(f"no Tune domain for {p!r}")  # pragma: no cover - exhaustive above


def to_optuna(p: ParamT) -> Any:
    """Convert a searched parameter to an Optuna distribution (imported lazily)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(p, (Uniform, LogUniform)):
        return FloatDistribution(p.low, p.high, log=isinstance(p, LogUniform))
    if isinstance(p, (RandInt, LogRandInt)):
        return IntDistribution(p.low, p.high, log=isinstance(p, LogRandInt))
    assert isinstance(p, (Choice, Grid)), p
    return CategoricalDistribution(list(p.values))


def to_configspace(params: dict[str, ParamT], seed: int | None = None) -> Any:
    """Convert the searched parameters to a ConfigSpace space (fixed ones are left out).

    `when:` becomes ConfigSpace conditions: EqualsCondition for one value, InCondition for
    several, AndConjunction of those for several names. A condition on a fixed parameter
    always holds (validation refuses one that never does), so it is left out.
    """
    import ConfigSpace as CS

    space = CS.ConfigurationSpace(seed=seed)
    for name, p in params.items():
        if isinstance(p, Uniform):
            hp = CS.UniformFloatHyperparameter(name, p.low, p.high)
        elif isinstance(p, LogUniform):
            hp = CS.UniformFloatHyperparameter(name, p.low, p.high, log=True)
        elif isinstance(p, RandInt):
            hp = CS.UniformIntegerHyperparameter(name, p.low, p.high)
        elif isinstance(p, LogRandInt):
            hp = CS.UniformIntegerHyperparameter(name, p.low, p.high, log=True)
        elif isinstance(p, Choice):
            hp = CS.CategoricalHyperparameter(name, list(p.values))
        elif isinstance(p, Fixed):
            continue
        else:
            raise ValueError(f"search.params.{name}: ConfigSpace cannot express type {p.kind}")
        space.add(hp)
    for name, p in params.items():
        parts = []
        for parent, wanted in (getattr(p, "when", None) or {}).items():
            if parent not in space:
                continue
            values = wanted if isinstance(wanted, list) else [wanted]
            child, other = space[name], space[parent]
            if len(values) == 1:
                parts.append(CS.EqualsCondition(child, other, values[0]))
            else:
                parts.append(CS.InCondition(child, other, values))
        if len(parts) > 1:
            space.add(CS.AndConjunction(*parts))
        elif parts:
            space.add(parts[0])
    return space
