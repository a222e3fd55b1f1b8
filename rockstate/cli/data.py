"""``rockstate states``, ``rockstate get STATE KEY``, ``rockstate scan STATE``: an operator's look at the data.

Nothing here defines a state: a name the cluster does not know is an error naming the states it
has (close ones first), never a new empty state. Keys are strings unless ``--key-type int`` or
``json`` (a JSON list is a tuple key, as a query's grouping key of several columns is).
``scan --prefix`` is matched on the decoded keys (a string key starting with it; with ``json``, a
tuple key whose first elements are the given list): the scan reads partitions in order until
``--limit`` entries matched, so keys come in partition order, not sorted.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Iterator

from ..errors import ConfigError, UnknownStateError
from ..store.catalog import close_matches, state_rows
from .common import Output, backend, human, json_default, output_of, print_json

PAGE = 1000


def cmd_states(args: argparse.Namespace) -> None:
    client = backend(args)
    try:
        rows = state_rows(client.stats()["states"])  # the status page's rows too
    finally:
        client.close()
    if output_of(args) == "json":
        return print_json(rows)
    Output(args).table(("name", "kind", "ttl", "keys", "bytes", "query", "operator"), [
        (r["name"], r["kind"], "" if r["ttl"] is None else f"{r['ttl']:g}s", r["keys"], human(r["bytes"]), r["query"] or "", r["operator"] or "")
        for r in rows])


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def parse_key(text: str, kind: str) -> Any:
    if kind == "str":
        return text
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"key {text!r} is not an integer (--key-type int)") from None
    try:
        return _tuples(json.loads(text))
    except ValueError as e:
        raise ConfigError(f"key {text!r} is not JSON (--key-type json): {e}") from None


def _handle(rs, name: str, states: dict):
    """The state's handle, of its own kind and TTL (so nothing is defined); UnknownStateError for a name it has not."""
    spec = states.get(name)
    if spec is None:
        close = close_matches(name, states)
        known = close or sorted(states)[:10]
        raise UnknownStateError(f"the cluster has no state {name!r}; " + (
            f"{'did you mean' if close else 'it has'} {', '.join(map(repr, known))}" if known else "it has none yet")
            + " (rockstate states lists them)")
    make = {"value": rs.value_state, "map": rs.map_state, "list": rs.list_state}[spec["kind"]]
    return make(name, ttl=spec["ttl"])


def _open(args: argparse.Namespace):
    from ..api import Rockstate

    client = backend(args)
    rs = Rockstate(client)
    try:
        states = client.stats()["states"]
        return rs, _handle(rs, args.state, states)
    except BaseException:
        rs.close()
        raise


def _show_key(key: Any) -> str:
    return key if isinstance(key, str) else json.dumps(key, default=json_default)


def _show_value(value: Any) -> str:
    return json.dumps(value, default=json_default, ensure_ascii=False)


def cmd_get(args: argparse.Namespace) -> None:
    key = parse_key(args.key, args.key_type)
    rs, state = _open(args)
    try:
        if state.kind == "value":
            missing = object()
            value = state.get(key, missing)
            found = value is not missing
        elif state.kind == "map":
            value = dict(state.items(key))
            found = bool(value)
        else:
            value = state.get(key)
            found = bool(value)
    finally:
        rs.close()
    if not found:
        print(f"rockstate: {args.state} has no value for key {_show_key(key)}", file=sys.stderr)
        sys.exit(1)
    if output_of(args) == "json":
        return print_json({"state": args.state, "key": key, "value": value})
    if output_of(args) == "plain":
        print(_show_value(value))
    else:
        print(json.dumps(value, default=json_default, ensure_ascii=False, indent=1))


def _entries(state, backend_, prefix: Any) -> Iterator[tuple[Any, Any]]:
    """(key, value) of a value or list state, (key, {user key: value}) entries of a map state, in partition order."""
    from ..serde import decode_key, decode_stream, decode_value, split_pair

    for pid in range(backend_.partitions):
        after = None
        while True:
            page = backend_.scan(state.name, pid, b"", after, PAGE)
            for k, v in page:
                if state.kind == "map":
                    key, user_key = split_pair(k)
                    if _matches(key, prefix):
                        yield (key, user_key), decode_value(v)
                else:
                    key = decode_key(k)
                    if _matches(key, prefix):
                        yield key, decode_stream(v) if state.kind == "list" else decode_value(v)
            if len(page) < PAGE:
                break
            after = page[-1][0]


def _matches(key: Any, prefix: Any) -> bool:
    if prefix is None:
        return True
    if isinstance(prefix, tuple):
        return isinstance(key, tuple) and key[:len(prefix)] == prefix
    if isinstance(key, tuple):
        key = key[0] if key else None
    return isinstance(key, str) and key.startswith(str(prefix))


def cmd_scan(args: argparse.Namespace) -> None:
    if args.limit is not None and args.limit < 0:
        raise ConfigError("--limit: give 0 (no limit) or more")
    prefix = None if args.prefix is None else (parse_key(args.prefix, "json") if args.key_type == "json" else args.prefix)
    rs, state = _open(args)
    rows = []
    try:
        for entry in _entries(state, rs.backend, prefix):
            rows.append(entry)
            if args.limit and len(rows) >= args.limit:
                break
    finally:
        rs.close()
    kind = state.kind
    mode = output_of(args)
    if mode == "json":
        if kind == "map":
            return print_json([{"key": k, "user_key": uk, "value": v} for (k, uk), v in rows])
        return print_json([{"key": k, "value": v} for k, v in rows])
    out = Output(args)
    if kind == "map":
        out.table(("key", "user key", "value"), [(_show_key(k), _show_key(uk), _show_value(v)) for (k, uk), v in rows])
    else:
        out.table(("key", "value"), [(_show_key(k), _show_value(v)) for k, v in rows])
    if mode != "plain" and args.limit and len(rows) >= args.limit:
        print(f"(the first {args.limit}; --limit N for more, 0 for all)", file=sys.stderr)
