"""What states exist: name, kind and TTL, and the rules for their names."""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass
from typing import Iterable, cast

from ..errors import InvalidInputError, InvalidNameError, StateKindError, UnknownStateError

KINDS = ("value", "map", "list")
RESERVED_PREFIX = "_"  # internal column families (staging, pipelines) start with it
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def check_name(name: object, what: str = "state", internal: bool = False) -> str:
    """``internal``: a name may also be the system's own, '_' followed by a valid name."""
    body = name[len(RESERVED_PREFIX):] if internal and isinstance(name, str) and name.startswith(RESERVED_PREFIX) else name
    if not isinstance(body, str) or not _NAME.match(body) or ".." in body:
        raise InvalidNameError(
            f"invalid {what} name {name!r}: use 1-128 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit, with no '..' and no path separators"
        )
    return cast(str, name)  # a str: its body is


def close_matches(name: str, known: Iterable[str]) -> list[str]:
    """The known names ``name`` may have meant: spelled alike, or a Spark query's state by its short name
    (``<query id>.<operator>.<name>``). The system's own ('_') names are never offered."""
    names = sorted(n for n in known if not n.startswith(RESERVED_PREFIX))
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    return close + [n for n in names if n.endswith("." + name) and n not in close]


def unknown_state(name: object, known: Iterable[str] = ()) -> UnknownStateError:
    """A read of a state that does not exist, naming the close matches among ``known``."""
    close = close_matches(name, known) if isinstance(name, str) else []
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    return UnknownStateError(f"no state {name!r}{hint} (pass create=True to value_state(), map_state() or list_state() "
                             "to define it; a first write defines it too)", state=name, matches=close)


@dataclass(frozen=True)
class StateSpec:
    name: str
    kind: str
    ttl: float | None = None  # seconds; None: entries never expire

    def __post_init__(self) -> None:
        check_name(self.name, internal=True)
        if self.kind not in KINDS:
            raise StateKindError(f"unknown state kind {self.kind!r}; kinds are {', '.join(KINDS)}")
        if self.ttl is not None and not (isinstance(self.ttl, (int, float)) and self.ttl > 0):
            raise StateKindError(f"ttl of state {self.name!r} must be a positive number of seconds or None, got {self.ttl!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StateSpec":
        if not isinstance(data, dict) or "name" not in data or "kind" not in data:
            raise InvalidInputError(
                f"a state spec is {{'name': str, 'kind': {' | '.join(KINDS)}, 'ttl': seconds or None}}, not {data!r:.200}")
        return cls(data["name"], data["kind"], data.get("ttl"))

    def check_same(self, other: "StateSpec") -> None:
        """Refuse one name used as two kinds or with two TTLs."""
        if (self.kind, self.ttl) != (other.kind, other.ttl):
            raise StateKindError(
                f"state {self.name!r} is a {self.kind} state (ttl={self.ttl}); "
                f"it cannot be opened as a {other.kind} state (ttl={other.ttl})"
            )


def state_rows(states: dict[str, dict]) -> list[dict]:
    """``rs.stats()``'s states as rows by name: name, kind, TTL, keys, bytes, and the Spark query and operator a
    query's state belongs to (it is named ``<query id>.<operator>.<state>``; None for others). ``rockstate states``
    and the status page both list them so."""
    rows = []
    for name, row in sorted(states.items()):
        parts = name.split(".")
        query, operator = (parts[0], parts[1]) if len(parts) >= 3 else (None, None)
        rows.append({"name": name, "kind": row["kind"], "ttl": row["ttl"], "keys": row["keys"], "bytes": row["bytes"],
                     "query": query, "operator": operator})
    return rows
