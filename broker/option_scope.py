"""The one wording of a bad broker setting, whichever part of the broker checks it.

The YAML reader (`broker.config`) checks the file, and `WalConfig` and `StorageSettings` check
themselves again because tests and tools build them directly; all three report a bad value the
same way, naming where the option comes from, the option, the value and what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

from danube_core.errors import ConfigError


@dataclass(frozen=True)
class OptionScope:
    """Where a group of options comes from, as its errors name it: `WAL option`, `config x.yml:`."""

    name: str

    def invalid(self, option: str, value: object, accepted: str) -> ConfigError:
        """The error for `option`=`value`, which is not what `accepted` describes."""
        return ConfigError(f"{self.name} {option}={value!r} is invalid; expected {accepted}")

    def require(self, ok: bool, option: str, value: object, accepted: str) -> None:
        """Raise `invalid(option, value, accepted)` unless `ok`."""
        if not ok:
            raise self.invalid(option, value, accepted)
