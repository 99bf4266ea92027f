"""Conditional parameters (`when:`) and the configurations a space holds.

A parameter with `when: {optimizer: sgd, depth: [2, 3]}` applies to a configuration only where
every named parameter is present and has the value, or one of the listed values (numbers by
value: 2 == 2.0; a bool only equals a bool). Where it does not apply it is absent: the trial
uses its default. Conditions may chain (a parameter conditional on a conditional one applies
only where its parent is present); they may not form a cycle (validation refuses one).

Here: the order in which a configuration is built (parents first), the grid with conditions
and constraints applied, and plain random draws (Python's `random`, no numpy, Ray or torch)
that validation and the model-based searchers' fallback use.

Imports neither Ray nor torch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Optional

from tuner.space import constraints as rules
from tuner.space.params import (
    Choice,
    Fixed,
    Grid,
    LogRandInt,
    LogUniform,
    ParamT,
    RandInt,
    Scalar,
    Uniform,
    grid_values,
    values_of,
)


def conditions(p: ParamT) -> dict[str, list[Scalar]]:
    """The parameter's `when:` with every value as a list ({} for an unconditional one)."""
    when = getattr(p, "when", None) or {}
    return {k: list(v) if isinstance(v, list) else [v] for k, v in when.items()}


def same(a: Any, b: Any) -> bool:
    """Equal as a condition compares: numbers by value, a bool only to a bool."""
    a = a.item() if hasattr(a, "item") else a
    b = b.item() if hasattr(b, "item") else b
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def applies(p: ParamT, config: Mapping[str, Any]) -> bool:
    """True when `p`'s condition holds in `config` (always, for an unconditional parameter)."""
    return all(
        name in config and any(same(config[name], v) for v in wanted)
        for name, wanted in conditions(p).items()
    )


def cycle(params: Mapping[str, ParamT]) -> Optional[list[str]]:
    """A cycle of conditions (a -> b -> a: a's condition names b, b's names a), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> Optional[list[str]]:
        state[name] = 1
        for parent in conditions(params[name]):
            if parent not in params:
                continue
            if state.get(parent) == 1:
                return path[path.index(parent) :] + [parent]
            if parent not in state:
                found = visit(parent, path + [parent])
                if found:
                    return found
        state[name] = 2
        return None

    for name in params:
        if name not in state:
            found = visit(name, [name])
            if found:
                return found
    return None


def order(params: Mapping[str, ParamT]) -> list[str]:
    """The names in declared order, except that each comes after the parameters its condition
    names (so a configuration can be built in one pass). Unconditional spaces keep their order."""
    assert cycle(params) is None, "validation refuses cycles"
    placed: list[str] = []

    def place(name: str) -> None:
        if name in placed:
            return
        for parent in conditions(params[name]):
            if parent in params:
                place(parent)
        placed.append(name)

    for name in params:
        place(name)
    return placed


def is_conditional(params: Mapping[str, ParamT]) -> bool:
    return any(conditions(p) for p in params.values())


_OTHER = "\x00any other value"  # stands for the values of an integer range no condition names
_NEVER_LIMIT = 100_000  # combinations of the named parameters past which never_apply gives up


def never_apply(params: Mapping[str, ParamT]) -> list[str]:
    """Conditional parameters that apply in no configuration (a chain that contradicts
    itself: c when {b: 1, a: 2} where b is there only when a is 1), in declared order.

    Exact: every combination of the parameters that conditions name is tried, each reduced
    to the values the conditions mention (plus one for the rest of a wide integer range).
    """
    named = {k for p in params.values() for k in conditions(p) if k in params}
    if not named:
        return []
    mentioned: dict[str, list[Any]] = {n: [] for n in named}
    for p in params.values():
        for k, wanted in conditions(p).items():
            if k in mentioned:
                mentioned[k] += wanted
    reduced: dict[str, ParamT] = {}
    for n in order(params):
        if n in named:
            listed = values_of(params[n])
            values = listed if listed is not None else _distinct([*mentioned[n], _OTHER])
            reduced[n] = Choice(type="choice", values=values, when=getattr(params[n], "when", None))
    seen: set[str] = set()
    names = list(reduced)
    choices = {n: list(reduced[n].values) for n in names}  # type: ignore[union-attr]
    for i, config in enumerate(_expand(reduced, names, choices, {})):
        if i >= _NEVER_LIMIT:
            return []
        seen.update(n for n, p in params.items() if applies(p, config))
    return [n for n, p in params.items() if conditions(p) and n not in seen]


def _distinct(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if not any(same(v, u) and type(v) is type(u) for u in out):
            out.append(v)
    return out


def outside(p: ParamT, value: Any) -> str:
    """Why `value` is not one `p` can take ('' if it is)."""
    listed = values_of(p) if isinstance(p, (Fixed, Choice, Grid)) else None
    if listed is not None:
        if any(same(value, v) for v in listed):
            return ""
        return f"is not one of its values ({', '.join(map(str, listed))})"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "is not a number"
    if isinstance(p, (RandInt, LogRandInt)) and value != int(value):
        return "is not an integer"
    if not p.low <= value <= p.high:  # type: ignore[union-attr]
        return f"is outside {p.low}..{p.high}"  # type: ignore[union-attr]
    return ""


# ----------------------------------------------------------------------------- grid


class TooLarge(Exception):
    """The grid has more than the given limit of combinations."""


def grid_configs(
    params: Mapping[str, ParamT],
    points: int,
    constraints: Iterable[str] = (),
    limit: Optional[int] = None,
) -> list[dict[str, Any]]:
    """Every combination in a fixed order (the first parameter varies slowest), each parameter
    only where its condition holds (so no two are the same), less those a constraint refuses.

    `limit`: raise TooLarge when the combinations before constraints pass it (counted without
    listing them when nothing is conditional).
    """
    if limit is not None and not is_conditional(params):
        size = math.prod(len(grid_values(p, points)) for p in params.values())
        if size > limit:
            raise TooLarge(f"a grid of {size:,} combinations")
    names = order(params)
    values = {n: grid_values(params[n], points) for n in names}
    out: list[dict[str, Any]] = []
    kept = list(constraints)
    for i, config in enumerate(_expand(params, names, values, {})):
        if limit is not None and i >= limit:
            raise TooLarge(f"a grid of more than {limit:,} combinations")
        if rules.allows(kept, config):
            out.append({n: config[n] for n in params if n in config})  # declared order
    return out


def _expand(
    params: Mapping[str, ParamT], names: list[str], values: dict[str, list[Any]], partial: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    if not names:
        yield dict(partial)
        return
    name, rest = names[0], names[1:]
    if not applies(params[name], partial):
        yield from _expand(params, rest, values, partial)
        return
    for v in values[name]:
        partial[name] = v
        yield from _expand(params, rest, values, partial)
    del partial[name]


# ----------------------------------------------------------------------------- random draws


def draw(p: ParamT, rng: random.Random) -> Scalar:
    """One value of `p` from Python's `random` (integer bounds inclusive)."""
    if isinstance(p, Fixed):
        return p.value
    if isinstance(p, (Choice, Grid)):
        return p.values[rng.randrange(len(p.values))]
    if isinstance(p, Uniform):
        return rng.uniform(p.low, p.high)
    if isinstance(p, LogUniform):
        return math.exp(rng.uniform(math.log(p.low), math.log(p.high)))
    if isinstance(p, RandInt):
        return rng.randint(p.low, p.high)
    assert isinstance(p, LogRandInt), p
    return min(p.high, int(math.exp(rng.uniform(math.log(p.low), math.log(p.high + 1)))))


def random_config(
    params: Mapping[str, ParamT], rng: random.Random, given: Optional[Mapping[str, Any]] = None
) -> dict[str, Any]:
    """One configuration: each parameter drawn where its condition holds; those in `given`
    take its value instead (a partial configuration completed by the space's own draws)."""
    config: dict[str, Any] = {}
    for name in order(params):
        if applies(params[name], config):
            config[name] = given[name] if given and name in given else draw(params[name], rng)
    return {n: config[n] for n in params if n in config}


def feasible_draw(
    params: Mapping[str, ParamT],
    constraints: Iterable[str],
    rng: random.Random,
    attempts: int,
    given: Optional[Mapping[str, Any]] = None,
) -> Optional[dict[str, Any]]:
    """A random configuration (with `given`'s values) every constraint allows, or None after
    `attempts` draws."""
    kept = list(constraints)
    for _ in range(attempts):
        config = random_config(params, rng, given)
        if rules.allows(kept, config):
            return config
    return None
