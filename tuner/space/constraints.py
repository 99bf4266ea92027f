"""Constraints between parameters (`search.constraints`): parsed once, checked on every config.

A constraint is one expression over parameter names and numbers, e.g. `width % heads == 0`
or `width * depth <= 4096`: arithmetic (`+ - * / // % **`, unary `-`/`+`), comparisons
(chains too: `1 <= depth < 4`) and `and`/`or`/`not` of comparisons. It is parsed with `ast`
and checked against a whitelist of node types, then walked by the small interpreter below:
nothing is ever compiled or `eval`ed, so a constraint cannot call, import or look anything up.

Rules, also in docs/how-to/search-space.md#constraints:
- A configuration breaks a constraint when the expression is false, or when evaluating it
  fails: division or modulo by zero, a power whose exponent is more than MAX_EXPONENT (or
  whose result would pass MAX_BITS bits), a complex result. Such a configuration never runs.
- A constraint applies only where every name it reads is in the configuration: with a
  conditional parameter absent (its `when:` does not hold), constraints reading it hold.

Imports neither Ray nor torch (validation runs before either starts).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Union

MAX_LENGTH = 500  # characters of one constraint: keeps the parse tree (and its depth) small
MAX_EXPONENT = 64
MAX_BITS = 4096  # an integer power past this many bits counts as failing, not computed

Number = Union[int, float]

_ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_SIGN: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
ALLOWED = "numbers, parameter names, + - * / // % **, comparisons, and/or/not"


class _Broken(Exception):
    """Evaluating the expression failed: the configuration breaks the constraint."""


@dataclass(frozen=True)
class Constraint:
    """One parsed constraint: its text, its tree and the parameter names it reads."""

    text: str
    tree: ast.expr
    names: frozenset[str]

    def holds(self, config: Mapping[str, Any]) -> bool:
        """True when `config` keeps the constraint (or lacks one of its names)."""
        if not self.names <= config.keys():
            return True
        try:
            return bool(_test(self.tree, config))
        except _Broken:
            return False


@lru_cache(maxsize=256)
def parse(text: str) -> Constraint:
    """Parse one constraint; ValueError with a one-line reason for anything else."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("must be a non-empty expression, e.g. 'width % heads == 0'")
    if len(text) > MAX_LENGTH:
        raise ValueError(f"longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise ValueError(f"not an expression ({getattr(err, 'msg', None) or err})") from None
    names: set[str] = set()
    _check_test(tree, names)
    return Constraint(text, tree, frozenset(names))


def allows(constraints: Iterable[str], config: Mapping[str, Any]) -> bool:
    """True when `config` keeps every constraint."""
    return all(parse(c).holds(config) for c in constraints)


# ----------------------------------------------------------------------------- checking


def _refuse(node: ast.AST) -> ValueError:
    what = type(node).__name__
    if isinstance(node, ast.Constant):
        what = f"the constant {node.value!r}"
    elif isinstance(node, ast.Call):
        what = "a call"
    elif isinstance(node, ast.Attribute):
        what = "an attribute"
    elif isinstance(node, (ast.BinOp, ast.UnaryOp)):
        what = f"the operator {type(node.op).__name__}"
    return ValueError(f"{what} is not allowed (only {ALLOWED})")


def _check_test(node: ast.expr, names: set[str]) -> None:
    """A truth value: a comparison, or and/or/not of truth values."""
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _check_test(value, names)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _check_test(node.operand, names)
    elif isinstance(node, ast.Compare):
        if not all(type(op) in _COMPARE for op in node.ops):
            raise ValueError(f"only the comparisons == != < <= > >= are allowed (only {ALLOWED})")
        for operand in (node.left, *node.comparators):
            _check_number(operand, names)
    elif isinstance(node, (ast.BinOp, ast.Name, ast.Constant, ast.UnaryOp)):
        raise ValueError("must be a comparison (e.g. 'width % heads == 0'), not a bare number")
    else:
        raise _refuse(node)


def _check_number(node: ast.expr, names: set[str]) -> None:
    """A number: a constant, a name, or arithmetic of numbers."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise _refuse(node)
    elif isinstance(node, ast.Name):
        names.add(node.id)
    elif isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        _check_number(node.left, names)
        _check_number(node.right, names)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _SIGN:
        _check_number(node.operand, names)
    elif isinstance(node, (ast.Compare, ast.BoolOp)) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)
    ):
        raise ValueError("a comparison or and/or/not cannot be used as a number")
    else:
        raise _refuse(node)


# ----------------------------------------------------------------------------- evaluating


def _test(node: ast.expr, config: Mapping[str, Any]) -> bool:
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_test(v, config) for v in node.values)
        return any(_test(v, config) for v in node.values)
    if isinstance(node, ast.UnaryOp):  # not
        return not _test(node.operand, config)
    assert isinstance(node, ast.Compare), node
    left = _number(node.left, config)
    for op, right_node in zip(node.ops, node.comparators, strict=True):
        right = _number(right_node, config)
        if not _COMPARE[type(op)](left, right):
            return False
        left = right
    return True


def _number(node: ast.expr, config: Mapping[str, Any]) -> Number:
    if isinstance(node, ast.Constant):
        return node.value  # type: ignore[no-any-return]
    if isinstance(node, ast.Name):
        value = config[node.id]
        value = value.item() if hasattr(value, "item") else value  # numpy scalars
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Broken(f"{node.id} is not a number")
        return value
    if isinstance(node, ast.UnaryOp):
        return _SIGN[type(node.op)](_number(node.operand, config))  # type: ignore[no-any-return]
    assert isinstance(node, ast.BinOp), node
    left, right = _number(node.left, config), _number(node.right, config)
    if isinstance(node.op, ast.Pow):
        _check_power(left, right)
    try:
        result = _ARITHMETIC[type(node.op)](left, right)
    except (ZeroDivisionError, OverflowError, ValueError) as err:
        raise _Broken(str(err)) from None
    if isinstance(result, complex):  # (-8) ** 0.5
        raise _Broken("a complex number")
    return result  # type: ignore[no-any-return]


def _check_power(base: Number, exponent: Number) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise _Broken(f"an exponent above {MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        if abs(base).bit_length() * exponent > MAX_BITS:
            raise _Broken(f"a power past {MAX_BITS} bits")
