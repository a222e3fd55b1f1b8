"""What states exist: name, kind and TTL, and the rules for their names."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..errors import InvalidNameError, StateKindError

KINDS = ("value", "map", "list")
RESERVED_PREFIX = "_"  # internal column families (staging, pipelines) start with it
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def check_name(name: object, what: str = "state") -> str:
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise InvalidNameError(
            f"invalid {what} name {name!r}: use 1-128 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit, with no '..' and no path separators"
        )
    return name


@dataclass(frozen=True)
class StateSpec:
    name: str
    kind: str
    ttl: float | None = None  # seconds; None: entries never expire

    def __post_init__(self) -> None:
        if not self.name.startswith(RESERVED_PREFIX):
            check_name(self.name)
        if self.kind not in KINDS:
            raise StateKindError(f"unknown state kind {self.kind!r}; kinds are {', '.join(KINDS)}")
        if self.ttl is not None and not (isinstance(self.ttl, (int, float)) and self.ttl > 0):
            raise StateKindError(f"ttl of state {self.name!r} must be a positive number of seconds or None, got {self.ttl!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StateSpec":
        return cls(data["name"], data["kind"], data.get("ttl"))

    def check_same(self, other: "StateSpec") -> None:
        """Refuse one name used as two kinds or with two TTLs."""
        if (self.kind, self.ttl) != (other.kind, other.ttl):
            raise StateKindError(
                f"state {self.name!r} is a {self.kind} state (ttl={self.ttl}); "
                f"it cannot be opened as a {other.kind} state (ttl={other.ttl})"
            )
