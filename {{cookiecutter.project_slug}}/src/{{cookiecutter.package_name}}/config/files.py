"""Config files: read TOML, follow `extends`.

A model's own keys may sit in a table named after it (`[gpt]` then `preset = "tiny"`, or the
dotted `gpt.preset = "tiny"`): they apply only when that model is selected, so one file serves
every model. A file may name a base with `extends = "tiny.toml"` (relative to the file itself);
the file's own keys then override the base's, whichever spelling either uses (`preset = ...`
over the base's `[gpt] preset`, and the reverse), so `configs/experiments/*.toml` hold only what
differs. Inside one file a key given both plainly and in its model's table with different values
is refused (which one was meant?). Several `--config` files merge left to right, each with its
bases resolved first; `key=value` overrides come after all of them
(`config.settings.load_config`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config_keys import ConfigError, read_toml

EXTENDS = "extends"

# What a source sets: each key by its spelling ("lr", "preset" or "gpt.preset") -> (value, the
# source that set it), in the order they were set: a key set again moves to the end, so the
# last one wins whichever spelling it has (`settings.load_config`).
Settings = dict[str, tuple[Any, str]]


def label(path: str | Path) -> str:
    """A file's name as config.toml's origins line shows it: `configs/tiny.toml` for the base
    `../tiny.toml` of `configs/experiments/x.toml`, and a name with a newline must not end the
    comment line."""
    name = os.path.normpath(path)
    return name if name.isprintable() else ascii(name)


def read_file(
    path: str | Path,
    check: Callable[[str, Any], Any],
    _chain: tuple[Path, ...] = (),
) -> Settings:
    """The values of one config file with its `extends` chain resolved: the base's first, then
    the file's own, each credited to the file that wrote it.

    `check(key, value)` converts a value (config.parse_value); its error gets the file's name.
    """
    path = Path(path)
    resolved = path.resolve()
    if resolved in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, resolved))
        raise ConfigError(f"config file {path}: extends forms a cycle: {cycle}")
    table = read_toml(path)
    values: Settings = {}
    base = table.pop(EXTENDS, None)
    if base is not None:
        if not isinstance(base, str) or not base.strip():
            raise ConfigError(f'config file {path}: extends must name a file, e.g. "tiny.toml"')
        base_path = path.parent / base
        if not base_path.is_file():
            raise ConfigError(
                f"config file {path}: extends {base!r}, but {base_path} is not a file "
                "(the path is relative to the file that names it)"
            )
        values.update(read_file(base_path, check, (*_chain, resolved)))
    try:
        own = own_values(table, check)
    except ConfigError as err:
        raise ConfigError(f"config file {path}: {err}") from None
    origin = label(path)
    for spelling, value in own.items():
        values.pop(spelling, None)  # the file's own keys come after (override) the base's
        values[spelling] = (value, origin)
    return values


def own_values(table: dict[str, Any], check: Callable[[str, Any], Any]) -> dict[str, Any]:
    """One file's keys by spelling, a model's table as "<model>.<key>", converted and checked."""
    own: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):  # a model's table, [gpt] (or gpt.preset = ... in TOML)
            own.update({f"{key}.{k}": check(f"{key}.{k}", v) for k, v in value.items()})
        else:
            own[key] = check(key, value)
    refuse_two_spellings(own, lambda key, value: f"{key} = {value!r}")
    return own


def refuse_two_spellings(values: dict[str, Any], spelt: Callable[[str, Any], str]) -> None:
    """Within one source (a file, the command line) a key may be given plainly (`preset`) or in
    its model's table (`gpt.preset`), not both with different values: neither would be sure
    to be the one meant. `spelt(key, value)` shows a setting as the source writes it."""
    for spelling, value in values.items():
        _, dot, name = spelling.partition(".")
        if dot and name in values and values[name] != value:
            raise ConfigError(
                f"{name!r} is set twice, as {spelt(name, values[name])} and as "
                f"{spelt(spelling, value)}; keep one"
            )
