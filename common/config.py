"""The one mechanism behind every config section: pydantic models, checked strictly, read from YAML.

Each section (``GPTConfig``, ``DataConfig``, ``TrainConfig``, ...) is a ``Section``: every field
declares its type, default, bounds and what it means on one line, and a rule across fields is a
validator beside them. ``build`` turns a plain dict (parsed YAML) into a section and any failure
into one line naming the key (``describe``, which the server's 4xx bodies use too). An unknown key
is refused with the closest valid one; a section lists the keys it no longer has in
``REMOVED_KEYS`` (key: ``Removed``, its "off" value and what to do instead): a saved run that wrote
one at that value still loads, and any other value is refused in one line that says where it went.
Types are strict: ``true`` is not an int, ``"3"`` is not a number; an int is accepted (and stored
as a float) where a float is expected."""

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Union

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from common.errors import UserError, one_line
from common.yaml_safe import BoundedSafeLoader, YamlLimitError, read_yaml_text


class ConfigError(UserError, ValueError):
    """A configuration file, override or value the user has to fix."""


def require(condition: bool, message: str, error: type[Exception] = ConfigError) -> None:
    if not condition:
        raise error(message)


class _Loader(BoundedSafeLoader):
    """YAML 1.2 numbers and booleans: in PyYAML's YAML 1.1 ``3e-3`` (no dot) is a *string* and
    ``on``/``no`` are booleans, which surprise people writing learning rates and wandb modes."""


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
    wrote it, so the key at ``off`` is dropped without a word; any other value is refused with ``advice``."""

    off: Any
    advice: str = LOST_BY_RECORDS


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    REMOVED_KEYS: ClassVar[dict[str, Removed]] = {}

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        for key, value in raw.items():
            if key in cls.model_fields:
                continue
            if key in cls.REMOVED_KEYS and value == cls.REMOVED_KEYS[key].off:
                continue
            if key in cls.REMOVED_KEYS:
                advice = cls.REMOVED_KEYS[key].advice
                raise PydanticCustomError("removed_key", "{key} {advice}", {"key": key, "advice": advice})
            raise PydanticCustomError("unknown_key", "unknown key {key!r}", {"key": key, "valid": list(cls.model_fields)})
        return {key: value for key, value in raw.items() if key in cls.model_fields}

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


def build(cls: type[BaseModel], raw: Any, path: str = "", error: type[Exception] = ConfigError) -> Any:
    """``cls`` from a plain dict; any problem raises ``error`` with one line naming the key."""
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        raise error(describe(e, cls, path, {"missing": "missing required config key {key!r}"})[1]) from None


def describe(error: ValidationError, model: type[BaseModel], path: str = "",
             wording: dict[str, str] | None = None) -> tuple[str, str]:
    """The first problem pydantic found in ``model`` (read at ``path``) as its key and one line naming it.
    ``wording`` phrases an error type its own way (``{key}``: where it is). A union's members each
    report what they wanted: the line joins their wishes."""
    problems = error.errors(include_url=False)
    first = problems[0]
    where = _key(first["loc"], model, path)
    ctx = first.get("ctx", {})
    key = _join(where, str(ctx.get("key")))
    if first["type"] == "removed_key":  # a section's own refusals of a key (``Section._known_keys``)
        return key, f"{key} {ctx['advice']}"
    if first["type"] == "unknown_key":
        close = difflib.get_close_matches(str(ctx["key"]), ctx["valid"], n=1, cutoff=0.5)
        hint = f"did you mean {_join(where, close[0])!r}?" if close else \
            f"valid keys{' in ' + where if where else ''}: {', '.join(ctx['valid'])}"
        return key, f"unknown config {'key' if where else 'section'} {key!r}; {hint}"
    if wording and first["type"] in wording:
        return where, wording[first["type"]].format(key=where)
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "value_error":
        return where, message if where and message.startswith(where) or not where else f"{where}: {message}"
    wishes = [re.sub(r"^\w+ should (be )?", "", p["msg"]) for p in problems if _key(p["loc"], model, path) == where]
    verb = "must be" if first["msg"].startswith("Input should be") else "must"
    return where, f"{where or 'the input'} {verb} {' or '.join(dict.fromkeys(wishes))}, got {_show(first['input'])}"


def _key(loc: tuple, model: Any, path: str) -> str:
    """A pydantic location as the key the user wrote: a union member's tag is no key, and is left out."""
    parts = [path] if path else []
    for part in loc:
        if model is Any or isinstance(part, int):
            parts.append(str(part))
        elif model is not None:  # a section's key, or one it does not have
            parts.append(part)
            model = _model_in(model.model_fields[part].annotation) if part in model.model_fields else None
    return ".".join(parts)


def _model_in(hint: Any) -> Any:
    """The section a field holds (also in a list, or one that may be null); None for plain values,
    ``Any`` when it may hold several kinds of section (their tags are then part of the path)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is list:
        return _model_in(args[0])
    if typing.get_origin(hint) in (Union, types.UnionType):
        models = {_model_in(arg) for arg in args} - {None}
        return models.pop() if len(models) == 1 else (Any if models else None)
    return hint if isinstance(hint, type) and issubclass(hint, BaseModel) else None


def _show(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return {dict: "a mapping", list: "a list"}.get(type(value), f"{value!r:.60}")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
