"""How one config key is declared, next to the code that reads it.

A general key is a field of a small dataclass, a section, in the module that reads it:

    @dataclass
    class OptimizerKeys:
        lr: float = key(6e-4, "AdamW peak learning rate", bounds=(0, 1e3), resume=True)

config/settings.py collects the sections into one `Config` (an editor completes `cfg.lr`). A
model declares its own keys the same way, as a section in its module under models/ that its spec
names (`GPTKeys`); a run's Config holds it under the model's name (`cfg.gpt.preset`). Everything
about a key is in its declaration: its type (that of the default), the values it
accepts, whether a checkpoint written with another value may continue, and the line of help the
docs table shows; validation, the defaults check of configs/default.toml and the docs table are
derived from it. Beside the keys: the one parser of the `key=value` spelling, the one reading
of a number (config keys and numeric command-line options), the one reader of a TOML file,
one-line error messages, the import of an optional package and the loader of the registries
(models, dataset kinds). This module imports nothing of the package, so every other one can
use it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib


def first_line(err: BaseException) -> str:
    """An exception's first line (or its type), for a one-line message that quotes it."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class ConfigError(ValueError):
    """A config key is unknown, or its value is not accepted. The message names the key."""


def split_assignment(item: str) -> tuple[str, str]:
    """`key=value` -> (key, value), both stripped: the one parser of that spelling (config
    overrides, `run_dir=DIR`, doctor's `data_dir=DIR`). A ConfigError names any other form."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{shown(item)} is not of the form key=value")
    return key.strip(), value.strip()


def read_toml(path: str | Path) -> dict[str, Any]:
    """One TOML file's table, or a one-line ConfigError naming the file and the cause."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory, not a TOML file") from None
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {path} is not valid UTF-8 TOML: {err}") from None


def load_registry(package: str, modules: tuple[str, ...], attribute: str) -> dict[str, Any]:
    """The registry of a folder whose members are one module and one line each (models,
    dataset kinds): each module's `attribute` (`SPEC`, `KIND`) by its `.name`; two modules
    that give one name are refused when the package is imported."""
    found: dict[str, Any] = {}
    for module in modules:
        entry = getattr(importlib.import_module(f".{module}", package), attribute)
        if entry.name in found:
            folder = package.rpartition(".")[2]
            raise ImportError(f"two entries are named {entry.name!r} ({folder}/{module}.py)")
        found[entry.name] = entry
    return found


def optional_import(module: str, extra: str, purpose: str, error: type[Exception] = ConfigError):
    """Import an optional package, or raise `error` in one line saying what needs it and which
    extra of this project installs it: optional_import("transformers", "hf", "model=hf")."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise error(
            f"{purpose} needs the optional package {module.partition('.')[0]} ({first_line(err)}): "
            f"pip install -e '.[{extra}]'"
        ) from None


def shown(value: Any) -> str:
    """A value as an error message shows it: its repr, or for a very long one the first 60
    characters and the length (a pasted file must not become the message)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


AUTO = ("auto", "true", "false")  # the choices of a key whose default decides by the hardware

_FORMS = {
    int: "an integer (ASCII digits), e.g. 100",
    float: "a number (ASCII digits), e.g. 0.001",
    bool: "true or false",
    str: "a string",
}


@dataclass(frozen=True)
class Key:
    """One config key. `bounds` are (low, high), inclusive unless `closed` says otherwise
    ("[)": high excluded, "(]": low excluded); `choices` lists the accepted strings; `check`
    is called with the parsed value and raises ConfigError for other forms (see checkpoint_every).
    `resume=True`: the value shapes the model, data order, optimizer or schedule, so a
    checkpoint written with another value cannot continue the run (unless force_resume=true)."""

    name: str
    default: Any
    help: str
    bounds: tuple[float, float] | None = None
    closed: str = "[]"
    choices: tuple[str, ...] | None = None
    resume: bool = False
    check: Callable[[Any], object] | None = None

    @property
    def type(self) -> type:
        return type(self.default)

    def accepted(self) -> str:
        """The accepted values in words, for errors and the docs table."""
        if self.choices:
            return ", ".join(self.choices)
        if self.bounds:
            low, high = self.bounds
            return f"{self.closed[0]}{_number(low)}, {_number(high)}{self.closed[1]}"
        return ""

    def parse(self, value: Any) -> Any:
        """A TOML value or a command-line string -> the key's type, checked."""
        result = _convert(self.name, self.type, value)
        self.validate(result)
        return result

    def validate(self, value: Any) -> None:
        if self.choices and value not in self.choices:
            raise ConfigError(
                f"config key {self.name!r} must be one of {', '.join(self.choices)}; "
                f"got {shown(value)}"
            )
        if self.bounds:
            low, high = self.bounds
            above = value > low if self.closed[0] == "(" else value >= low
            below = value < high if self.closed[1] == ")" else value <= high
            if not (above and below):
                raise ConfigError(
                    f"config key {self.name!r} must be in {self.accepted()}, got {shown(value)}"
                )
        if self.check is not None:
            self.check(value)


def key(default: Any, help: str, **declaration: Any) -> Any:
    """A config key as a field of a section: its default, its line of help and what `Key` takes
    besides (bounds, closed, choices, resume, check). Its name is the field's."""
    return dataclasses.field(default=default, metadata={"key": (help, declaration)})


def keys_of(section: type) -> tuple[Key, ...]:
    """The `Key`s a section declares, in order; its annotations must name its defaults' types."""
    found = []
    for field in dataclasses.fields(section):
        help, declaration = field.metadata["key"]
        kind = type(field.default)
        if field.type not in (kind, kind.__name__):
            raise TypeError(
                f"{section.__name__}.{field.name} is annotated "
                f"{getattr(field.type, '__name__', field.type)} but its default "
                f"{field.default!r} is a {kind.__name__}"
            )
        found.append(Key(field.name, field.default, help, **declaration))
    return tuple(found)


def owned_keys(registry: dict[str, Any], what: str) -> dict[str, tuple[Key, list[str]]]:
    """The own config keys of a registry's entries (models, dataset kinds: each entry's `keys`
    section, or None): name -> (declaration, the entries that declare it). Two entries may share
    a key by declaring it alike (e.g. one section subclassing the other's): `name=value` and the
    docs table know a key by its name alone."""
    keys: dict[str, tuple[Key, list[str]]] = {}
    for name, entry in registry.items():
        for own in keys_of(entry.keys) if entry.keys else ():
            if own.name in keys and keys[own.name][0] != own:
                raise ImportError(
                    f"config key {own.name!r} is declared differently by {what} "
                    f"{', '.join(keys[own.name][1])} and {name}; rename one or declare it alike"
                )
            keys.setdefault(own.name, (own, []))[1].append(name)
    return keys


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _convert(key: str, kind: type, value: Any) -> Any:
    try:
        if not isinstance(value, str | int | float | bool):  # a TOML list, table or date
            raise ValueError(value)
        if kind is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("true", "1", "yes"):
                return True
            if str(value).lower() in ("false", "0", "no"):
                return False
            raise ValueError(value)
        if kind is str:
            if isinstance(value, bool):
                raise ValueError(value)
            text = str(value)
            if not text.isprintable() or len(text) > 4096:  # newlines would break config.toml
                raise ConfigError(
                    f"config key {key!r} expects one line of printable text (at most 4096 "
                    f"characters), got {text[:80]!r}"
                )
            return text
        if isinstance(value, bool) or (kind is int and isinstance(value, float)):
            raise ValueError(value)
        result = read_number(kind, value)
        if kind is float and not math.isfinite(result):
            raise ValueError(value)
        return result
    except ConfigError:
        raise
    except (ValueError, TypeError, OverflowError):
        raise ConfigError(
            f"config key {key!r} expects {_FORMS[kind]}, got {shown(value)}"
        ) from None


def read_number(kind: type, value: str | int | float) -> int | float:
    """`value` as `kind` (int or float), the one reading of a number: a config key's and a
    command-line option's. ASCII digits only: Python's int("١٢") is 12 and float("２") is 2.0;
    ValueError for those. (A command checks its options' ranges, nan and inf included, itself.)"""
    if isinstance(value, str) and not value.strip().isascii():
        raise ValueError(value)
    return kind(value)


def integer_option(text: str) -> int:
    """The argparse type of an integer option (--workers): read as a config key's value is."""
    return _option(int, text)


def number_option(text: str) -> float:
    """The argparse type of a number option (--temperature): read as a config key's value is."""
    return _option(float, text)


def _option(kind: type, text: str) -> int | float:
    try:
        number = read_number(kind, text)
    except ValueError:
        # argparse prints it as "argument --workers: expects ..." under its usage, exit 2
        raise argparse.ArgumentTypeError(f"expects {_FORMS[kind]}, got {shown(text)}") from None
    if not math.isfinite(number):  # inf and nan: no option means them
        raise argparse.ArgumentTypeError(f"expects a finite number, got {shown(text)}")
    return number


# ------------------------------------------- checkpoint_every and eval_every, each parsed once
# At most 12 digits a number: a longer one is a typo (and int() refuses 4300 digits itself).
_NUMBER = r"([0-9]{1,12}(?:\.[0-9]{1,12})?)"
_INTERVAL = re.compile(r"([0-9]{1,12})|" + _NUMBER + "min|" + _NUMBER + "epochs?|auto", re.ASCII)


@dataclass(frozen=True)
class Interval:
    """checkpoint_every or eval_every: every `steps` steps, every `minutes` minutes, every
    `epochs` passes over the training split, Young/Daly (`auto`), or never (all zero:
    checkpoints then only at the end)."""

    steps: int = 0
    minutes: float = 0.0
    epochs: float = 0.0
    auto: bool = False


def parse_interval(text: str, name: str = "checkpoint_every") -> Interval:
    """checkpoint_every's value: "100" steps, "30min", "1epoch" / "0.5epochs", "auto" or "0"."""
    if name == "checkpoint_every":
        forms = 'a number of steps ("100"), minutes ("30min"), epochs ("1epoch"), "auto" or "0"'
    else:
        forms = 'a number of steps ("100"), epochs ("1epoch", "0.5epochs") or "0"'
    match = _INTERVAL.fullmatch(text)
    timed = match and (match.group(2) is not None or text == "auto")
    if not match or (timed and name != "checkpoint_every"):
        raise ConfigError(f"config key {name!r} expects {forms}; got {shown(text)}")
    if text == "auto":
        return Interval(auto=True)
    if match.group(2) is not None:
        return Interval(minutes=float(match.group(2)))
    if match.group(3) is not None:
        if float(match.group(3)) <= 0:
            raise ConfigError(f'config key {name!r}: epochs must be above 0 ("0" for never)')
        return Interval(epochs=float(match.group(3)))
    return Interval(steps=int(match.group(1)))


def parse_every(text: str) -> Interval:
    """eval_every's value: "100" steps, "1epoch" / "0.5epochs", or "0" (no evaluation)."""
    return parse_interval(text, "eval_every")


def not_empty(what: str) -> Callable[[str], None]:
    """A check for a string key that must name something (run_dir= would train into `.`)."""

    def check(value: str) -> None:
        if not value.strip():
            raise ConfigError(f"config key {what!r} must not be empty")

    return check
