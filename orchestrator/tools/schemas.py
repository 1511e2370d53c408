"""The tools' JSON schemas, their descriptions, and a small validator for their arguments.

Descriptions speak of the sandbox in general ("an absolute path; list '/' to see what
exists"), never of one project's zones: the same definitions serve every worker, and the
model finds the zones by listing ``/`` or reading the security context.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.timeouts import MAX_TIMEOUT_S

PATH = {
    "type": "string",
    "description": "An absolute path as the sandbox sees it; list '/' to see what exists.",
}


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, what it does (for the model) and the JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The plain shape most LLM APIs take (``name``, ``description``, ``input_schema``)."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }

    def to_openai(self) -> dict[str, Any]:
        """The function-calling shape: ``{"type": "function", "function": {..., "parameters"}}``."""
        function = {
            "name": self.name,
            "description": self.description,
            "parameters": self.input_schema,
        }
        return {"type": "function", "function": function}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "list",
        "List a folder of the sandbox: names, kinds (file, folder, symlink, ...) and sizes. "
        "'/' lists the top-level folders you can use. Links are shown, never followed.",
        _object({"path": {**PATH, "default": "/"}}, []),
    ),
    ToolSpec(
        "read",
        "Read a file. Text comes back as a window of lines with total_lines and whether it "
        "was truncated (by lines or bytes): read on with offset. Images come back whole; other "
        "binary files are described, not shown.",
        _object(
            {
                "path": PATH,
                "offset": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "First line to return, counting from 1.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "How many lines to return at most.",
                },
            },
            ["path"],
        ),
    ),
    ToolSpec(
        "write",
        "Write a text file (replacing it, or appending), creating missing folders. Some "
        "folders are read-only and some writes are kept for review before they take effect: "
        "the result says so (review: true). Call 'context' to see what is writable.",
        _object(
            {
                "path": PATH,
                "content": {"type": "string", "description": "The file's new text."},
                "append": {
                    "type": "boolean",
                    "default": False,
                    "description": "Add to the end instead of replacing.",
                },
            },
            ["path", "content"],
        ),
    ),
    ToolSpec(
        "delete",
        "Delete a file, or a folder with everything in it.",
        _object({"path": PATH}, ["path"]),
    ),
    ToolSpec(
        "stat",
        "What is at a path: kind, size, permissions and modification time (a link is "
        "described, never followed).",
        _object({"path": PATH}, ["path"]),
    ),
    ToolSpec(
        "exec",
        "Run a command inside the sandbox (a shell string, run by /bin/sh -c, or an argument "
        "list). Returns exit code, stdout, stderr (capped; truncation is flagged), duration "
        "and whether it timed out. It sees the same folders at the same paths.",
        _object(
            {
                "command": {
                    "anyOf": [
                        {"type": "string"},
                        {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    ],
                    "description": "A shell command line, or the program and its arguments.",
                },
                "cwd": {**PATH, "description": "Working folder (an absolute sandbox path)."},
                "timeout": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": MAX_TIMEOUT_S,
                    "description": "Seconds before the command and its children are killed.",
                },
                "stdin": {"type": "string", "description": "Text given on standard input."},
                "env": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "Extra environment variables.",
                },
            },
            ["command"],
        ),
    ),
    ToolSpec(
        "stage",
        "Put files forward for review by a person: they become one change set, which a person "
        "approves or rejects later. Returns the change set's id.",
        _object(
            {
                "files": {
                    "type": "array",
                    "items": PATH,
                    "minItems": 1,
                    "description": "Absolute sandbox paths of the files to stage.",
                },
                "message": {
                    "type": "string",
                    "minLength": 1,
                    "description": "What the change is and why, for the reviewer.",
                },
            },
            ["files", "message"],
        ),
    ),
    ToolSpec(
        "context",
        "What this sandbox allows: trust level, each top-level folder's read/write/delete "
        "rights and approvals, allowed suffixes and sizes, network and limits.",
        _object({}, []),
    ),
    ToolSpec(
        "checkpoint",
        "Save this sandbox's own state (its files and its root) as a snapshot, "
        "before a risky step: returns the snapshot's id, from which a person or a harness "
        "starts new sessions. Only where the worker allows it (context: session.checkpoints).",
        _object({}, []),
    ),
    ToolSpec(
        "branch",
        "Start new, independent sandboxes from a checkpoint of this one: from 'snapshot' (an "
        "id 'checkpoint' answered in this sandbox) or, without it, from a checkpoint taken "
        "now. Each sees the checkpoint's files and changes only its own; this sandbox goes "
        "on unchanged. Returns their session ids and the snapshot's id: a person or a "
        "harness works in them (not this sandbox's tools). Only where the worker allows it "
        "(context: session.checkpoints).",
        _object(
            {
                "count": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 4,
                    "default": 1,
                    "description": "How many sandboxes to start.",
                },
                "snapshot": {
                    "type": "string",
                    "minLength": 1,
                    "description": "A snapshot id this sandbox's 'checkpoint' answered "
                    "(default: checkpoint now).",
                },
            },
            [],
        ),
    ),
)

BY_NAME = {spec.name: spec for spec in SPECS}


class InvalidArguments(OrchestratorError):
    """A tool call whose name or arguments do not match the tool's schema."""


_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
}


def _label(where: str) -> str:
    return f"'{where}'" if where else "arguments"


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _check(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    """The first way ``value`` breaks ``schema`` (the subset these tools use), or None.
    ``where`` is the argument's path (``env.HOME``, ``files[0]``; empty for the whole)."""
    label = _label(where)
    if "anyOf" in schema:
        problems = [_check(value, option, where) for option in schema["anyOf"]]
        if not all(problems):
            return None
        for option, problem in zip(schema["anyOf"], problems, strict=True):
            if isinstance(value, _TYPES[option["type"]]):  # the right kind, a wrong value
                return problem
        kinds = " or ".join(_describe(option) for option in schema["anyOf"])
        return f"{label} must be {kinds}, not {_json_type(value)}"
    kind = schema.get("type")
    if kind is not None:
        expected = _TYPES[kind]
        if (isinstance(value, bool) and kind != "boolean") or not isinstance(value, expected):
            return f"{label} must be {_describe(schema)}, not {_json_type(value)}"
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        return f"{label} must not be empty"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            return f"{label} must be a finite number, not {value}"
        if "minimum" in schema and value < schema["minimum"]:
            return f"{label} must be at least {schema['minimum']}"
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return f"{label} must be more than {schema['exclusiveMinimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{label} must be at most {schema['maximum']}"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            return f"{label} must hold at least {schema['minItems']} item(s)"
        for index, item in enumerate(value):
            problem = _check(item, schema.get("items", {}), f"{where}[{index}]")
            if problem:
                return problem
    if isinstance(value, dict):
        return _check_object(value, schema, where)
    return None


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], where: str) -> str | None:
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            return f"'{_join(where, name)}' is required"
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            problem = _check(item, properties[name], _join(where, name))
        elif extra is False:
            known = ", ".join(properties) or "none"
            return f"unknown argument '{_join(where, name)}' (known: {known})"
        elif isinstance(extra, Mapping):
            problem = _check(item, extra, _join(where, name))
        else:
            problem = None
        if problem:
            return problem
    return None


def _describe(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type", "a value")
    if kind == "array":
        return f"an array of {schema.get('items', {}).get('type', 'value')}s"
    return {"integer": "an integer", "object": "an object", "array": "an array"}.get(
        kind, f"a {kind}"
    )


def _json_type(value: Any) -> str:
    for name, kind in (
        ("null", type(None)),
        ("a boolean", bool),
        ("an integer", int),
        ("a number", float),
        ("a string", str),
        ("an array", list),
        ("an object", dict),
    ):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def validate(name: str, args: Any) -> dict[str, Any]:
    """``args`` checked against tool ``name``'s schema, with defaults filled in.

    Raises :class:`InvalidArguments` with one line naming the tool, the argument and the fix.
    """
    spec = BY_NAME.get(name)
    if spec is None:
        raise InvalidArguments(f"Unknown tool '{name}'. Tools: {', '.join(BY_NAME)}")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise InvalidArguments(
            f"Tool '{name}': arguments must be an object, not {_json_type(args)}"
        )
    problem = _check(args, spec.input_schema, "")
    if problem:
        raise InvalidArguments(f"Tool '{name}': {problem}")
    filled = dict(args)
    for key, prop in spec.input_schema["properties"].items():
        if key not in filled and "default" in prop:
            filled[key] = prop["default"]
    return filled
