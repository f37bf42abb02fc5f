"""The one mechanism behind every config section: typed dataclasses, checked strictly, read from YAML.

Each section (``GPTConfig``, ``DataConfig``, ``TrainConfig``, ...) is a dataclass whose
``__post_init__`` calls ``check_types`` and then checks its values with ``require``. ``build`` turns
a plain dict (parsed YAML) into such a dataclass: an unknown key is rejected with a suggestion, a
nested section is built the same way, and any failure becomes one line naming the key. A section
lists the keys it no longer has in ``REMOVED_KEYS`` (key: ``Removed``, its "off" value and what to do
instead): a saved run that wrote one at that value still loads, and any other value is refused in one
line that says where the option went.
Types are strict: ``true`` is not an int, ``"3"`` is not a number; an int is accepted (and stored
as a float) where a float is expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from common.errors import UserError, one_line
from common.yaml_safe import BoundedSafeLoader, YamlLimitError, read_yaml_text


class ConfigError(UserError, ValueError):
    """A configuration file, override or value the user has to fix."""


def require(condition: bool, message: str, error: type[Exception] = ConfigError) -> None:
    if not condition:
        raise error(message)


def require_one_of(value: str, key: str, choices: tuple[str, ...]) -> None:
    require(value in choices, f"{key} must be {', '.join(choices[:-1])} or {choices[-1]} (got {value!r})")


def require_in(value: float, key: str, low: float, high: float, *, low_open: bool = False,
               high_open: bool = False, note: str = "") -> None:
    """``value`` is a finite number in the interval; nan and infinities never are."""
    above = low < value if low_open else low <= value
    below = value < high if high_open else value <= high
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    require(math.isfinite(value) and above and below, f"{key} must be in {interval}{note} (got {value!r})")


class _Loader(BoundedSafeLoader):
    """YAML 1.2 numbers and booleans; no duplicate keys, no alias bombs.

    PyYAML follows YAML 1.1, where ``3e-3`` (no dot) is a *string* and ``on``/``no`` are
    booleans; both surprise people writing learning rates and wandb modes.
    """


_BOOL, _FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_BOOL, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                  |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def merged(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Raw config ``base`` with ``update`` laid over it: sections merged key by key, any other value
    of ``update`` winning (what a program that writes configs, a lab, builds them with)."""
    return {key: merged(base[key], update[key]) if isinstance(base.get(key), dict) and isinstance(update.get(key), dict)
            else update.get(key, base.get(key)) for key in {**base, **update}}


def read_yaml_file(path: str | Path) -> Any:
    """Parse a YAML file, read with a size cap (``/dev/zero`` never ends); errors are one line."""
    try:
        text = read_yaml_text(path)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} not found; pass an existing YAML file") from None
    except YamlLimitError as e:
        raise ConfigError(str(e)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {str(path)!r}: {one_line(e)}") from None
    return read_yaml(text, source=str(path))


def read_yaml(text: str, source: str) -> Any:
    """Parse YAML text; a syntax error or a refused document becomes a ConfigError naming
    ``source`` (and the line)."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except YamlLimitError as e:
        raise ConfigError(f"{source}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or one_line(e)
        raise ConfigError(f"{source}{where}: invalid YAML ({problem}); fix the syntax") from None


# What a key a section no longer has says when a config still names it: the common case first.
LOST_BY_RECORDS = "was removed: it lost by the records protocol (docs/records.md, tried and dropped); delete the key"


@dataclasses.dataclass(frozen=True)
class Removed:
    """A key a section no longer has. Every saved run's config lists every key of the version that
    wrote it, so the key at ``off`` (the value that changed nothing) is dropped without a word and
    those files still load; any other value is refused with ``advice``, after the key's name."""

    off: Any
    advice: str = LOST_BY_RECORDS


def build(cls: type, raw: Any, path: str = "", error: type[Exception] = ConfigError) -> Any:
    """``cls`` from a plain dict; any problem raises ``error`` with one line naming the key."""
    kwargs = _init_kwargs(cls, raw, path, error)
    try:
        return cls(**kwargs)
    except (UserError, ValueError, TypeError) as e:
        message = one_line(e)
        if path and not message.startswith(path):
            message = f"{path}: {message}"
        raise error(message) from None


def typed_values(cls: type, raw: Any, path: str = "", error: type[Exception] = ConfigError) -> dict[str, Any]:
    """Every field of ``cls`` as it would hold it: ``raw``'s keys checked as ``build`` checks them,
    each value type-checked, and the defaults filled in. For a loader that explains a bad value
    in the user's words before the dataclass's own plain checks see it."""
    kwargs = _init_kwargs(cls, raw, path, error)
    values = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        value = kwargs.get(f.name, f.default)
        if value is dataclasses.MISSING:
            value = f.default_factory()
        values[f.name] = _checked(value, _hints(cls)[f.name], _join(path, f.name), error)
    return values


def _init_kwargs(cls: type, raw: Any, path: str, error: type[Exception]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise error(f"{path or 'the config'} must be a mapping of keys, got {_show(raw)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _hints(cls)
    removed = getattr(cls, "REMOVED_KEYS", {})
    kwargs = {}
    for key, value in raw.items():
        if key in removed and key not in fields:
            require(value == removed[key].off, f"{_join(path, key)} {removed[key].advice}", error)
            continue
        if key not in fields:
            raise error(_unknown_key_message(str(key), list(fields), path))
        section = _section_type(hints[key])
        if section is not None and isinstance(value, dict):
            value = build(section, value, _join(path, key), error)
        kwargs[key] = value
    for name, f in fields.items():
        if name not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise error(f"missing required config key {_join(path, name)!r}")
    return kwargs


def _section_type(hint: Any) -> type | None:
    """The dataclass a field holds, also one that may be null (``LoraConfig | None``); else None."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        sections = [arg for arg in typing.get_args(hint) if dataclasses.is_dataclass(arg)]
        return sections[0] if len(sections) == 1 else None
    return hint if dataclasses.is_dataclass(hint) else None


def check_types(section: Any, path: str = "", error: type[Exception] = ConfigError) -> None:
    """Check every field of a dataclass instance against its type hint; ints become floats
    where a float is expected. Call it first thing in ``__post_init__``."""
    for name, hint in _hints(type(section)).items():
        value = _checked(getattr(section, name), hint, _join(path, name), error)
        object.__setattr__(section, name, value)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {name: hint for name, hint in typing.get_type_hints(cls).items() if name in names}


def _checked(value: Any, hint: Any, key: str, error: type[Exception]) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        for arg in args:
            try:
                return _checked(value, arg, key, error)
            except error:
                continue
    elif origin is list:
        if isinstance(value, list):
            return [_checked(v, args[0], f"{key}[{i}]", error) for i, v in enumerate(value)]
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, hint):  # also None against NoneType
        return value
    raise error(f"{key} must be {_describe(hint)}, got {_show(value)}")


def _describe(hint: Any) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (Union, types.UnionType):
        text = " or ".join(_describe(a) for a in args if a is not type(None))
        return text + " or null" if type(None) in args else text
    if typing.get_origin(hint) is list:
        plural = {bool: "true or false values", int: "whole numbers", float: "numbers", str: "strings"}
        return f"a list of {plural.get(args[0]) or _describe(args[0])}"
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
    if hint in names:
        return names[hint]
    return "a section (mapping)" if dataclasses.is_dataclass(hint) else getattr(hint, "__name__", str(hint))


def _show(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return {dict: "a mapping", list: "a list"}.get(type(value), repr(value))


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _unknown_key_message(key: str, valid: list[str], path: str) -> str:
    kind = "config key" if path else "config section"
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if close:
        return f"unknown {kind} {_join(path, key)!r}; did you mean {_join(path, close[0])!r}?"
    return f"unknown {kind} {_join(path, key)!r}; valid keys{' in ' + path if path else ''}: {', '.join(valid)}"
