"""Tools a model may call: plain Python functions, each described by OpenAI's ``function`` shape.

A tool is named as rewards are: a built-in name (``BUILT_IN``), or ``module:function`` imported from
where the command runs. Such a function is described by its signature (each parameter annotated
``str``, ``int``, ``float`` or ``bool``) and its docstring's first paragraph::

    def weekday(date: str) -> str:
        \"\"\"The weekday of an ISO date, e.g. 2024-05-01.\"\"\"
        return datetime.date.fromisoformat(date).strftime("%A")

is ``my_tools:weekday``. It returns text (anything else is written as JSON, or by ``str``).
``tools.toolbox`` runs it apart from the caller's process. This package imports nothing else of the
project: the chat format, the engine and the data sources build on it."""

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tools.calculator import DESCRIPTION as CALCULATOR_DESCRIPTION
from tools.calculator import PARAMETERS as CALCULATOR_PARAMETERS

# OpenAI's rule for a function's name.
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ToolError(ValueError):
    """A tool that cannot be set up (unknown, not importable, undescribable): one line, with the fix."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call, and how it is described to whoever offers it."""

    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of an object: the call's arguments
    reference: str  # "module:function": how a fresh process finds the function

    def schema(self) -> dict[str, Any]:
        """OpenAI's tool shape, as a request's ``tools`` lists it."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


BUILT_IN = {
    "calculator": Tool("calculator", CALCULATOR_DESCRIPTION, CALCULATOR_PARAMETERS, "tools.calculator:calculator"),
}


def built_in(name: str) -> Tool:
    """The built-in tool ``name``."""
    if name not in BUILT_IN:
        raise ToolError(f"unknown tool {name!r}: use one of {', '.join(BUILT_IN)} or module:function")
    return BUILT_IN[name]


def import_function(reference: str) -> Callable[..., Any]:
    """The function ``module:function`` names. Only a tool's worker process imports it
    (``tools.toolbox``): a module may even leave at import (``sys.exit``, Ctrl-C), which is caught."""
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except BaseException as error:  # noqa: BLE001 - a tool module that fails to import, however: one line
        raise ToolError(f"tool {reference!r}: cannot import {module_name} ({failure(error)})") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ToolError(f"tool {reference!r}: {module_name} has no function {attribute!r}")
    return function


def failure(error: BaseException) -> str:
    """What went wrong, in one line: the exception's type and the first line of its message."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def describe(function: Callable[..., Any], reference: str) -> Tool:
    """A function's tool description, from its name, docstring and annotated parameters."""
    name = getattr(function, "__name__", "")
    if not NAME.fullmatch(name):
        raise ToolError(f"tool {reference!r}: its name must be 1 to 64 letters, digits, _ or -")
    try:
        signature = inspect.signature(function, eval_str=True)
    except (TypeError, ValueError, NameError) as error:
        raise ToolError(f"tool {reference!r}: cannot read its signature ({error})") from None
    properties, required = {}, []
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD, parameter.POSITIONAL_ONLY):
            raise ToolError(f"tool {reference!r}: parameter {parameter.name!r} cannot be given by name; "
                            "use plain named parameters")
        if parameter.annotation not in JSON_TYPES:
            raise ToolError(f"tool {reference!r}: annotate parameter {parameter.name!r} with str, int, float "
                            "or bool")
        properties[parameter.name] = {"type": JSON_TYPES[parameter.annotation]}
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    description = inspect.getdoc(function) or ""
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return Tool(name, description.split("\n\n")[0].replace("\n", " "), parameters, reference)


def check_arguments(tool: Tool, arguments: Any) -> str | None:
    """What is wrong with ``arguments`` for ``tool`` (None: nothing), checked against its schema's
    properties, required names and types before the tool runs."""
    if not isinstance(arguments, dict):
        return f"the arguments must be a JSON object, got {type(arguments).__name__}"
    properties = tool.parameters.get("properties", {})
    unknown = [key for key in arguments if key not in properties]
    if unknown:
        return f"{tool.name} takes no argument {unknown[0]!r} (it takes {', '.join(properties) or 'none'})"
    missing = [key for key in tool.parameters.get("required", []) if key not in arguments]
    if missing:
        return f"{tool.name} needs the argument {missing[0]!r}"
    for key, value in arguments.items():
        expected = properties[key].get("type")
        if expected is not None and not _is_json_type(value, expected):
            return f"{tool.name}'s argument {key!r} must be {_KINDS.get(expected, expected)}, got {_json_kind(value)}"
    return None


_PYTHON_TYPES = {"string": str, "boolean": bool, "object": dict, "array": list}
_KINDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
          "object": "an object", "array": "an array"}


def _json_kind(value: Any) -> str:
    for kind, python in (("true or false", bool), ("an integer", int), ("a number", float), ("a string", str),
                         ("an object", dict), ("an array", list)):
        if isinstance(value, python):
            return kind
    return "null"


def _is_json_type(value: Any, expected: str) -> bool:
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    kind = _PYTHON_TYPES.get(expected)
    return kind is None or isinstance(value, kind)
