"""Messages (one small dataclass per operation) and the envelopes that carry them.

A message class names its operation in ``op`` and declares msgpack-native
fields; defining it makes it a dataclass and registers it, so any peer that
imports it can decode it::

    class Get(Message):
        op = "get"
        partition: int
        key: bytes

On the wire a message is a map of its fields plus ``"op"``. A request frame is
``{"id": int, "msg": message, "deadline": seconds-from-now | None}``; the reply
is ``{"id": id, "ok": result}`` for a plain msgpack result, ``{"id": id, "msg":
message}`` when the handler returned a ``Message``, or ``{"id": id, "err":
error}``. A reply with ``"id": None`` carries an error about the whole
connection, which the server then closes.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar

from ..errors import ProtocolError, RockstateError, UnknownOperationError, from_wire

PROTOCOL_VERSION = 2  # 2: connections open with the greeting (frames.MAGIC)

_NATIVE = (int, str, bytes, bool, float, list, dict, types.NoneType)
_registry: dict[str, type[Message]] = {}
_UNKNOWN = object()  # what ``_types.get`` answers for a field the message does not have


def _wire_types(hint: Any) -> tuple[type, ...] | None:
    """The exact types a decoded field may have (msgpack decodes to exact types); None: anything."""
    if hint is Any:
        return None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        alternatives = [_wire_types(arg) for arg in typing.get_args(hint)]
        return None if None in alternatives else tuple(t for ts in alternatives for t in ts)
    base = typing.get_origin(hint) or hint  # list[int] -> list; items are not checked
    if base is float:
        return (float, int)  # msgpack keeps 3 and 3.0 apart; a float field accepts both
    if base in _NATIVE:
        return (base,)
    raise TypeError(f"{hint!r} is not a msgpack-native type")


@typing.dataclass_transform()
class Message:
    """Base of every request and reply message; see the module docstring."""

    op: ClassVar[str]
    roles: ClassVar[frozenset[str] | None] = None  # roles (rpc.auth) a caller needs; None: any authenticated caller
    _types: ClassVar[dict[str, tuple[type, ...] | None]]
    _required: ClassVar[frozenset[str]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        op = cls.__dict__.get("op")
        if not isinstance(op, str) or not op:
            raise TypeError(f"message class {cls.__qualname__} must set op = '<name>'")
        taken = _registry.get(op)  # a module run again (reload, notebook) may redefine its own
        if taken is not None and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
            raise TypeError(f"op {op!r} of {cls.__qualname__} is taken by {taken.__qualname__}")
        dataclasses.dataclass(cls)
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        cls._types = {f.name: _wire_types(hints[f.name]) for f in fields}
        cls._required = frozenset(
            f.name for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        _registry[op] = cls

    def to_wire(self) -> dict:
        wire = {name: getattr(self, name) for name in self._types}
        wire["op"] = self.op
        return wire

    @classmethod
    def from_wire(cls, wire: Any) -> Message:
        """Decode and check a message; on a subclass, the message must be of that class."""
        if not isinstance(wire, dict):
            raise ProtocolError(f"a message must be a map, not {type(wire).__name__}")
        op = wire.get("op")
        found = _registry.get(op) if isinstance(op, str) else None
        if found is None:
            raise UnknownOperationError(f"unknown operation {op!r}", op=op)
        if not issubclass(found, cls):
            raise ProtocolError(f"expected a {cls.op!r} message, got {op!r}", op=op)
        fields = dict(wire)
        del fields["op"]
        if not found._required <= fields.keys():
            name = min(found._required - fields.keys())
            raise ProtocolError(f"{op!r} message lacks field {name!r}", op=op, field=name)
        types = found._types
        for name, value in fields.items():
            allowed = types.get(name, _UNKNOWN)
            if allowed is _UNKNOWN:
                raise ProtocolError(f"{op!r} message has unknown field {name!r}", op=op, field=name)
            if allowed is not None and type(value) not in allowed:
                raise ProtocolError(
                    f"field {name!r} of {op!r} message must be {' or '.join(t.__name__ for t in allowed)},"
                    f" not {type(value).__name__}", op=op, field=name)
        message = found(**fields)
        message.received()
        return message

    def received(self) -> None:
        """Checks only a message from a peer needs, run as it is decoded (a sender building one from its own state
        skips them): none here."""


# -- the connection handshake ------------------------------------------------
# Client: Hello -> server: Welcome, or Challenge -> client: Proof -> server: Welcome.
# Any refusal is an error reply (ProtocolVersionError, AuthenticationError), then close.


class Hello(Message):
    """First request on every connection. Never change its fields: the version is read before them."""

    op = "hello"
    version: int
    name: str


class Challenge(Message):
    """The server knows a cluster secret: prove the client knows it too (see ``auth``)."""

    op = "challenge"
    nonce: bytes


class Proof(Message):
    op = "proof"
    digest: bytes
    nonce: bytes | None = None  # the client's own challenge to the server (None: an older client)


class Welcome(Message):
    op = "welcome"
    name: str
    proof: bytes | None = None  # the server's answer to the client's nonce (see ``auth``)

    def to_wire(self) -> dict:  # an older client knows no proof field: sent only when there is one
        wire = super().to_wire()
        if self.proof is None:
            del wire["proof"]
        return wire


# -- envelopes ---------------------------------------------------------------


def request(rid: int, msg: Message, deadline: float | None) -> dict:
    return {"id": rid, "msg": msg.to_wire(), "deadline": deadline}


def parse_request(frame: Any) -> tuple[int, dict, float | None]:
    """The envelope only: a bad envelope spoils the connection, a bad message only its request."""
    if not isinstance(frame, dict):
        raise ProtocolError(f"a request must be a map, not {type(frame).__name__}")
    rid, wire, deadline = frame.get("id"), frame.get("msg"), frame.get("deadline")
    if type(rid) is not int:
        raise ProtocolError(f"request id must be an int, not {type(rid).__name__}")
    if not isinstance(wire, dict):
        raise ProtocolError(f"request {rid} carries no message map")
    if deadline is not None and type(deadline) not in (int, float):
        raise ProtocolError(f"deadline of request {rid} must be a number of seconds or None")
    return rid, wire, deadline


def reply(rid: int | None, result: Any) -> dict:
    if isinstance(result, Message):
        return {"id": rid, "msg": result.to_wire()}
    return {"id": rid, "ok": result}


def error_reply(rid: int | None, error: RockstateError) -> dict:
    return {"id": rid, "err": error.to_wire()}


def parse_reply(frame: Any) -> tuple[int | None, Any]:
    """The reply's id and its result; an error reply's error is returned, not raised."""
    if not isinstance(frame, dict) or "id" not in frame:
        raise ProtocolError("a reply must be a map with an id")
    rid = frame["id"]
    if isinstance(frame.get("err"), dict):
        return rid, from_wire(frame["err"])
    if "msg" in frame:
        try:
            return rid, Message.from_wire(frame["msg"])
        except ProtocolError as e:  # this reply is bad, the connection is not
            return rid, e
    if "ok" in frame:
        return rid, frame["ok"]
    raise ProtocolError(f"reply {rid} has neither ok, msg nor err")
