"""The sweep file described for people and editors: the reference in docs/, the JSON Schema."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tuner.config.objectives import OLDER_SPELLING
from tuner.config.sections import SweepConfig


def reference_markdown() -> str:
    """The sweep-file reference as a Markdown table, from the field descriptions."""
    rows = ["| key | default | meaning |", "| --- | --- | --- |"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            path = f"{prefix}{name}"
            sub = field.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                rows.append(f"| **`{path}`** | | {_md(model_doc(sub))} |")
                walk(sub, path + ".")
                continue
            if field.is_required():
                default = "required"
            elif field.default_factory is not None:
                default = f"`{field.default_factory()}`"
            else:
                default = f"`{field.default}`"
            rows.append(f"| `{path}` | {default} | {_md(field.description or '')} |")

    walk(SweepConfig, "")
    return "\n".join(rows) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def model_doc(model: type[BaseModel]) -> str:
    return (model.__doc__ or "").strip().splitlines()[0]


def json_schema() -> dict[str, Any]:
    """JSON Schema of the sweep file, for editors (yaml-language-server)."""
    schema = SweepConfig.model_json_schema()
    # Files written before `direction` say `mode`: still valid, marked so editors say which is now.
    direction = schema["properties"]["direction"]
    schema["properties"][OLDER_SPELLING] = {
        "anyOf": direction["anyOf"],
        "deprecated": True,
        "description": "The older spelling of direction (give one of the two).",
        "title": OLDER_SPELLING.capitalize(),
    }
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "tuner sweep file"
    return schema
