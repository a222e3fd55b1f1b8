"""The ``rockstate`` command: coordinator, node, status, states, get, scan, drain, undrain, remove, checkpoint, savepoint,
demo.

Conventions (docs/operations.md, "The command line"):

- the options of every command that talks to a cluster (``--coordinator``, ``--secret-file``,
  ``--tls-*-file``, ``--output``) and ``-v`` go before or after the command;
- every flag can come from ``ROCKSTATE_<NAME>`` (``--coordinator-wait``: ``ROCKSTATE_COORDINATOR_WAIT``;
  a switch such as ``--partitions`` takes 1/true/yes or 0/false/no, and leaves any other value to the
  command it was meant for: ``ROCKSTATE_PARTITIONS=128`` is the coordinator's), for every command; a
  flag on the command line wins. ``--yes`` is the one exception: a rollback is never confirmed by the environment;
- ``--output table|plain|json`` (``--json`` is ``--output json``); piped tables never wrap;
- exit status: 0 done (``status``: healthy), 1 ``status`` degraded or ``get`` found nothing,
  2 an error (``status``: unavailable, or the coordinator could not be asked), 64 a usage error.

One module per command group: ``servers`` (coordinator, node, demo), ``status``, ``data`` (states,
get, scan), ``members`` (drain, undrain, remove), ``checkpoints`` (checkpoint, savepoint); ``common`` what they share.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, NoReturn

from .. import __version__
from ..config import CoordinatorConfig, NodeConfig, settings
from ..errors import ConfigError, RockstateError
from .checkpoints import cmd_checkpoint, cmd_savepoint
from .common import DEFAULT_COORDINATOR, human, parse_size
from .data import cmd_get, cmd_scan, cmd_states
from .members import cmd_drain, cmd_remove, cmd_undrain
from .servers import COORDINATOR_WAIT, add_fields, cmd_coordinator, cmd_demo, cmd_node
from .status import EVENTS_SHOWN, cmd_status

__all__ = ["build_parser", "main", "human", "parse_size", "USAGE_ERROR"]

USAGE_ERROR = 64  # sysexits.h EX_USAGE: never 1 or 2, which `rockstate status` answers with
NOT_FROM_ENVIRONMENT = {"help", "version", "yes"}
TRUE, FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def _global_options(p: argparse.ArgumentParser, server: bool = False) -> None:
    """The options that may come before or after the command. Defaults stay out of the namespace, so one given
    before the command is not overwritten by the command's parser; ``_resolve`` fills in the rest."""
    S = argparse.SUPPRESS
    p.add_argument("-v", "--verbose", action="store_true", default=S, help="debug logging (env ROCKSTATE_VERBOSE)")
    if server:
        return  # a server's --coordinator, --secret-file and --tls-* are its config fields (add_fields)
    p.add_argument("--coordinator", default=S, help=f"the coordinator's host:port, or several as host:port,host:port... "
                   f"(default: {DEFAULT_COORDINATOR}; env ROCKSTATE_COORDINATOR)")
    p.add_argument("--secret-file", default=S, help="file holding the cluster's shared secret (default: $ROCKSTATE_SECRET)")
    p.add_argument("--tls-ca-file", default=S, help="PEM CA bundle the coordinator's certificate must chain to (enables TLS)")
    p.add_argument("--tls-cert-file", default=S, help="PEM client certificate, when the cluster requires one")
    p.add_argument("--tls-key-file", default=S, help="PEM key of --tls-cert-file")
    p.add_argument("-o", "--output", choices=("table", "plain", "json"), default=S,
                   help="table (default; piped, it never wraps), plain (tab-separated), json")
    p.add_argument("--json", action="store_true", default=S, help="print the result as JSON (--output json)")


def _client_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    _global_options(p)
    return p


def _actions(sub, name: str, summary: str, client: argparse.ArgumentParser, actions: dict, func) -> None:
    """``rockstate NAME ACTION [args]``: each action its own parser, so flags and arguments mix in any order."""
    p = sub.add_parser(name, help=summary, description=summary, parents=[client])
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, (action_help, arguments) in actions.items():
        a = acts.add_parser(action, help=action_help, description=action_help, parents=[client])
        for args, kwargs in arguments:
            a.add_argument(*args, **kwargs)
        a.set_defaults(func=func, _parser=a)


YES = (("--yes", "-y"), {"action": "store_true", "help": "do not ask for confirmation (never from the environment)"})
KEY_TYPE = (("--key-type",), {"choices": ("str", "int", "json"), "default": None,
                              "help": "how KEY (and --prefix) is read: str (default), int, json (a list is a tuple key)"})


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rockstate", description="Distributed RocksDB-backed keyed state for PySpark pipelines",
                    epilog="Every flag can also come from ROCKSTATE_<NAME> (ROCKSTATE_COORDINATOR, ROCKSTATE_OUTPUT...). "
                           "Exit status: 0 done / healthy, 1 degraded (status) or not found (get), 2 error / unavailable, 64 usage.")
    parser.add_argument("--version", action="version", version=f"rockstate {__version__}")
    _global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    client = _client_parser()

    p = sub.add_parser("coordinator", help="run the coordinator (membership, partition table, checkpoints, status page)")
    _global_options(p, server=True)
    add_fields(p, CoordinatorConfig)
    p.set_defaults(func=cmd_coordinator, _parser=p, _model=CoordinatorConfig)

    p = sub.add_parser("node", help="run a node that owns and serves partitions")
    _global_options(p, server=True)
    add_fields(p, NodeConfig)
    p.add_argument("--coordinator-wait", type=float, default=None, metavar="SECONDS",
                   help=f"give up and exit (status 2) when the coordinator cannot be reached for this long; every failed "
                        f"attempt is logged with its reason (default: {COORDINATOR_WAIT:g}; 0: wait for ever; env ROCKSTATE_COORDINATOR_WAIT)")
    p.set_defaults(func=cmd_node, _parser=p, _model=NodeConfig)

    p = sub.add_parser("status", parents=[client], help="the cluster's health first (exit 0 healthy, 1 degraded, 2 unavailable), then details",
                       description="A summary: the verdict, nodes by state, partitions without a live owner or short of in-sync "
                                   "backups, moves, the latest checkpoint, the leader. Exit status: 0 healthy, 1 degraded, "
                                   "2 unavailable (or the coordinator could not be asked), 64 a usage error.")
    p.add_argument("--partitions", action="store_true", default=None, help="each partition's owner, replicas and state")
    p.add_argument("--events", action="store_true", default=None, help="the recent events (see --type, --last)")
    p.add_argument("--type", action="append", default=None, metavar="TYPE",
                   help="only events of this type (repeat, or comma-separated: --type member_dead,primary_promoted); implies --events")
    p.add_argument("--last", type=int, default=None, metavar="N", help=f"events shown (default {EVENTS_SHOWN}; 0: all kept)")
    p.add_argument("--watch", nargs="?", type=float, const=2.0, default=None, metavar="SECONDS",
                   help="show it again every SECONDS (default 2) until Ctrl-C; exits with the last verdict's status")
    p.set_defaults(func=cmd_status, _parser=p)

    p = sub.add_parser("states", parents=[client], help="the cluster's states: kind, TTL, keys, bytes, the Spark query and operator")
    p.set_defaults(func=cmd_states, _parser=p)

    p = sub.add_parser("get", parents=[client], help="the value of KEY in STATE (exit 1: no value)")
    p.add_argument("state", help="the state's full name (rockstate states lists them)")
    p.add_argument("key")
    p.add_argument(*KEY_TYPE[0], **KEY_TYPE[1])
    p.set_defaults(func=cmd_get, _parser=p)

    p = sub.add_parser("scan", parents=[client], help="entries of STATE, in partition order")
    p.add_argument("state", help="the state's full name (rockstate states lists them)")
    p.add_argument("--prefix", default=None, help="only keys starting with it (matched on decoded keys; the scan reads every partition)")
    p.add_argument("--limit", type=int, default=None, help="stop after N entries (default 100; 0: all)")
    p.add_argument(*KEY_TYPE[0], **KEY_TYPE[1])
    p.set_defaults(func=cmd_scan, _parser=p)

    for name, func, text in (
            ("drain", cmd_drain, "move every partition off NODE; it gets none again until undrained"),
            ("undrain", cmd_undrain, "a drained NODE takes partitions again"),
            ("remove", cmd_remove, "forget NODE for good: dead, left, or drained and stopped, holding no partition")):
        p = sub.add_parser(name, parents=[client], help=text)
        p.add_argument("node", help="the node's id (rockstate status lists them)")
        p.add_argument("--timeout", type=float, default=None, help="seconds to wait for the moves (default 600)")
        p.set_defaults(func=func, _parser=p)

    checkpoint_id = (("id",), {"nargs": "?", "type": int, "help": "checkpoint id (default: the latest completed)"})
    _actions(sub, "checkpoint", "trigger, list, inspect or restore the cluster's checkpoints", client, {
        "trigger": ("take a checkpoint now", []),
        "list": ("the checkpoint history (DELETED: removed by retention)", []),
        "inspect": ("a checkpoint's metadata", [checkpoint_id]),
        "restore": ("roll the live cluster back to a checkpoint (asks first)", [checkpoint_id, YES]),
    }, cmd_checkpoint)
    name = (("name",), {"help": "the savepoint's name"})
    _actions(sub, "savepoint", "create, list or restore savepoints (self-contained copies of a checkpoint)", client, {
        "create": ("copy a checkpoint to a named savepoint", [name, (("--checkpoint",), {"type": int, "default": None,
                   "help": "from this checkpoint (default: take a new one)"})]),
        "list": ("the savepoints", []),
        "restore": ("roll the live cluster back to a savepoint (asks first)", [name, YES]),
    }, cmd_savepoint)

    p = sub.add_parser("demo", help="a CDC pipeline on PySpark through a node failure and a join, verified end to end")
    _global_options(p, server=True)
    from ..demo import add_arguments

    add_arguments(p)
    _defaults_after_environment(p)
    p.set_defaults(func=cmd_demo, _parser=p)
    return parser


def _defaults_after_environment(p: argparse.ArgumentParser) -> None:
    """A flag's default kept aside, so that ``_resolve`` can tell a flag not given (then ROCKSTATE_<NAME>, then the
    default) from one given with the default's value."""
    for action in p._actions:
        if action.option_strings and action.default not in (None, argparse.SUPPRESS) and action.dest not in NOT_FROM_ENVIRONMENT:
            action.rockstate_default = action.default  # type: ignore[attr-defined]
            action.default = argparse.SUPPRESS


def _from_environment(action: argparse.Action, text: str) -> Any:
    env = f"ROCKSTATE_{action.dest.upper()}"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        word = text.strip().lower()
        if word not in TRUE | FALSE:  # another command's setting of the same name (ROCKSTATE_PARTITIONS=128): not this switch's
            return None
        return (word in TRUE) == isinstance(action, argparse._StoreTrueAction)
    if isinstance(action, argparse._AppendAction):
        return [t for t in text.split(",") if t.strip()]
    if action.nargs == "?" and not text.strip():
        return action.const
    try:
        value = action.type(text) if callable(action.type) else text
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
        raise ConfigError(f"{env}={text!r}: not a valid {action.option_strings[-1]} ({e})") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{env}={text!r}: choose one of {', '.join(map(str, action.choices))}")
    return value


def _resolve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Flags not given on the command line from ``ROCKSTATE_<NAME>``, then the defaults. A server's config fields are
    left to ``config.load``, which reads the same variables (and the YAML file) and checks them."""
    model = getattr(args, "_model", None)
    fields = set(settings(model)) if model is not None else set()
    actions = {a.dest: a for a in [*parser._actions, *args._parser._actions]
               if a.option_strings and a.dest not in NOT_FROM_ENVIRONMENT | fields}
    for dest, action in actions.items():
        if getattr(args, dest, None) is not None:
            continue
        text = os.environ.get(f"ROCKSTATE_{dest.upper()}")
        value = None if text is None else _from_environment(action, text)
        if value is not None:
            setattr(args, dest, value)
        elif getattr(args, dest, None) is None:
            setattr(args, dest, getattr(action, "rockstate_default", None))
    if model is None or "coordinator" not in fields:
        args.coordinator = getattr(args, "coordinator", None) or DEFAULT_COORDINATOR
    args.verbose = bool(getattr(args, "verbose", None))
    if getattr(args, "type", None) and args.command == "status":
        args.events = True
    if getattr(args, "last", None) is None:
        args.last = EVENTS_SHOWN
    if getattr(args, "limit", None) is None:
        args.limit = 100
    if getattr(args, "key_type", None) is None:
        args.key_type = "str"
    if getattr(args, "timeout", None) is None and args.command in ("drain", "undrain", "remove"):
        args.timeout = 600.0
    return args


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _resolve(parser, args)
    except ConfigError as e:
        print(f"rockstate: error: {e}", file=sys.stderr)
        sys.exit(USAGE_ERROR)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in filter(None, os.environ.get("ROCKSTATE_DEBUG", "").split(",")):  # debug logging of these modules only
        logging.getLogger(name.strip()).setLevel(logging.DEBUG)
    try:
        args.func(args)
    except RockstateError as e:
        print(f"rockstate: error: {e}", file=sys.stderr)
        sys.exit(2)
