"""Config files: read TOML, follow `extends`.

A model's own keys may sit in a table named after it (`[gpt]` then `preset = "tiny"`): they
apply only when that model is selected, so one file serves every model. A file may name a base
with `extends = "tiny.toml"` (relative to the file itself); the file's own keys then override
the base's, so `configs/experiments/*.toml` hold only what differs. Several
`--config` files merge left to right, each with its bases resolved first; `key=value` overrides
come after all of them (`config.settings.load_config`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config_keys import ConfigError, read_toml

EXTENDS = "extends"


def read_file(
    path: str | Path,
    check: Callable[[str, Any], Any],
    _chain: tuple[Path, ...] = (),
) -> dict[str, Any]:
    """The values of one config file with its `extends` chain resolved (base first).

    `check(key, value)` converts a value (config.parse_value); its error gets the file's name.
    """
    path = Path(path)
    resolved = path.resolve()
    if resolved in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, resolved))
        raise ConfigError(f"config file {path}: extends forms a cycle: {cycle}")
    table = read_toml(path)
    values: dict[str, Any] = {}
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
    for key, value in table.items():
        try:
            if isinstance(value, dict):  # a model's table, [gpt]: merged with the base's
                own = {f"{key}.{k}": check(f"{key}.{k}", v) for k, v in value.items()}
                values.setdefault(key, {}).update({k.split(".", 1)[1]: v for k, v in own.items()})
            else:
                values[key] = check(key, value)
        except ConfigError as err:
            raise ConfigError(f"config file {path}: {err}") from None
    return values
