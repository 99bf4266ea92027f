"""YAML as tuner reads it: safe, bounded, without duplicate keys, and numbers as numbers.

PyYAML's SafeLoader with four changes, all for files written by hand or by a hostile hand:
- `1e-3` is a float (YAML 1.2), not the string YAML 1.1 makes of it;
- a mapping that repeats a key is refused (PyYAML keeps the last silently);
- nesting deeper than MAX_DEPTH is refused (the composer recurses: RecursionError);
- a document whose aliases expand to more than MAX_NODES nodes is refused before it is
  built: 367 bytes of nested aliases ("billion laughs") expand to gigabytes in the
  validators, which copy shared structures.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 50
MAX_NODES = 100_000
_MERGE = "tag:yaml.org,2002:merge"


class YAMLRefused(ValueError):
    """Well-formed YAML tuner will not read; `str()` is one line, with the line number."""


class _Loader(yaml.SafeLoader):
    def __init__(self, stream: Any):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YAMLRefused(f"nested deeper than {MAX_DEPTH} levels{_at(self.peek_event())}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Node) -> Any:
        _expanded(node, {}, set(), 1)
        return super().construct_document(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE or not isinstance(key_node, ScalarNode):
                    continue  # merged keys may be overridden: that is what `<<` is for
                k = self.construct_object(key_node)
                if k in seen:
                    raise YAMLRefused(f"duplicate key '{k}'{_at(key_node)}")
                seen.add(k)
        return super().construct_mapping(node, deep=deep)


class _Dumper(yaml.SafeDumper):
    """Quotes what _Loader would read as another type (the string "1e-3")."""


# YAML 1.2's floats without a dot (1e-3, 5E+4); YAML 1.1, and so PyYAML, reads them as strings.
for _cls in (_Loader, _Dumper):
    _cls.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )


def _at(node: Any) -> str:
    mark = getattr(node, "start_mark", None)
    return f" at line {mark.line + 1}" if mark else ""


def _expanded(node: Node, sizes: dict[int, tuple[int, int]], open_: set[int], depth: int) -> tuple[int, int]:
    """(nodes, height) of `node` with every alias expanded; refuses too many, too deep, or a
    node that contains itself. Memoised, so it costs one visit per node as written."""
    if depth > MAX_DEPTH:
        raise YAMLRefused(f"nested deeper than {MAX_DEPTH} levels once aliases are expanded{_at(node)}")
    done = sizes.get(id(node))
    if done is not None:
        if depth + done[1] > MAX_DEPTH:
            raise YAMLRefused(f"nested deeper than {MAX_DEPTH} levels once aliases are expanded{_at(node)}")
        return done
    if id(node) in open_:
        raise YAMLRefused(f"an alias refers to a node that contains it{_at(node)}")
    open_.add(id(node))
    if isinstance(node, SequenceNode):
        children = list(node.value)
    elif isinstance(node, MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    count, height = 1, 0
    for child in children:
        c, h = _expanded(child, sizes, open_, depth + 1)
        count, height = count + c, max(height, h + 1)
        if count > MAX_NODES:
            raise YAMLRefused(f"expands to more than {MAX_NODES:,} values (aliases?){_at(node)}")
    open_.discard(id(node))
    sizes[id(node)] = (count, height)
    return count, height


def load(text: str) -> Any:
    """One YAML document, read by the rules above; yaml.YAMLError or YAMLRefused if not."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except RecursionError:
        raise YAMLRefused(f"nested too deeply (more than {MAX_DEPTH} levels)") from None


def dump(data: Any) -> str:
    """YAML that `load` reads back as `data` (keys in their order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)
