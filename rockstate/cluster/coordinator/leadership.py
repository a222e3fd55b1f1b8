"""The coordinator's leadership: it leads only while ``control/leadership.py``'s ``CoordinatorRole`` says so.

``Election`` (with ``--zookeeper``) carries ZooKeeper's news (kazoo's threads)
to the coordinator's event loop, in the order it came: elected, deposed (the
session ended, or a write was refused: it resigns and contends again),
suspended and reconnected. Everything the coordinator keeps goes through
``persistence.ZooKeeperDocuments``, fenced by this leadership.

``Leading`` asks the role what each piece of news means. Elected (or
reconnected while still holding the lock): load the documents, take them up,
open the checkpoint storage, and only then lead and begin (monitor,
resumption, periodic checkpoints). Deposed or suspended: stop every task at
once. While it does not lead, every request is answered ``NotLeaderError``
naming the leader, which members and clients follow (``leader_channel.py``).
A single coordinator leads alone from the start.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Awaitable, Callable, Coroutine, Protocol

from kazoo.client import KazooState

from ...config import CoordinatorConfig
from ...control.leadership import CoordinatorRole
from ...errors import NotLeaderError, ZooKeeperError
from ...rpc.messages import Message
from ...rpc.server import Connection, Handler
from .persistence import ZooKeeperDocuments
from ..zkstore import Leadership, ZooKeeperStore

log = logging.getLogger(__name__)


class Contender(Protocol):
    def elected(self) -> None: ...
    def deposed(self) -> None: ...
    def suspended(self) -> None: ...
    def reconnected(self) -> None: ...


def zookeeper_cluster(config: CoordinatorConfig) -> str:
    """The cluster's name under ``/rockstate`` (the checkpoints' ``cluster_name``)."""
    return config.cluster_name or "default"


class Election:
    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.store: ZooKeeperStore | None = None
        self.leadership: Leadership | None = None  # from start(): until then it knows no leader

    async def start(self, identifier: str, contender: Contender) -> ZooKeeperDocuments:
        """Connect, and contend as ``identifier`` (the coordinator's address); answers the documents it keeps."""
        loop = asyncio.get_running_loop()

        def post(event: str) -> Callable[..., None]:  # from kazoo's threads, in order, to the loop
            def posted(*_: object) -> None:
                loop.call_soon_threadsafe(getattr(contender, event))
            return posted

        self.store = store = await asyncio.to_thread(
            ZooKeeperStore, self.config.zookeeper or "", zookeeper_cluster(self.config),
            timeout=max(self.config.zookeeper_session_timeout, 2.0), session_timeout=self.config.zookeeper_session_timeout)
        self.leadership = leadership = store.leadership(identifier, on_elected=post("elected"), on_deposed=post("deposed"))
        states = {KazooState.LOST: post("deposed"), KazooState.SUSPENDED: post("suspended"),
                  KazooState.CONNECTED: post("reconnected")}
        self._listener = lambda state: states[state]()
        store.client.add_listener(self._listener)
        self.contender = contender
        documents = ZooKeeperDocuments(store, leadership, lambda error: self.resign())
        leadership.start()
        log.info("coordinator %s contends for leadership on ZooKeeper %s", identifier, self.config.zookeeper)
        return documents

    def resign(self) -> None:
        """Stop acting now (a write was refused, or the documents could not be read) and contend again."""
        self.contender.deposed()
        if self.leadership is not None:  # (it resigns only once contending)
            self.leadership.resign()

    async def coordinators(self) -> dict:
        """Who leads and who stands by, as ZooKeeper's election says."""
        try:
            store, leadership = self.store, self.leadership
            if leadership is None or store is None or not store.client.connected:
                raise ZooKeeperError("not in touch with ZooKeeper" if leadership else "not contending yet")
            contenders = await asyncio.to_thread(leadership.contenders)
        except ZooKeeperError as e:
            return {"leader": None, "standbys": [], "zookeeper": self.config.zookeeper, "error": str(e)}
        return {"leader": next(iter(contenders), None), "standbys": contenders[1:], "zookeeper": self.config.zookeeper}

    async def not_leader(self, identifier: str) -> NotLeaderError:
        leader = (await self.coordinators())["leader"]
        leader = None if leader == identifier else leader  # elected, not leading yet (loading, or suspended)
        return NotLeaderError(f"coordinator {identifier} does not lead; "
                              + (f"the leader is {leader}" if leader else "no leader is serving yet: retry shortly"),
                              leader=leader)

    async def stop(self) -> None:
        if self.store is not None:
            self.store.client.remove_listener(self._listener)  # what closing the session says is not news
            await asyncio.to_thread(self.store.close)


class Leading:
    """The coordinator's side of its role: what it does when elected, deposed, suspended, reconnected."""

    def __init__(self, election: Election | None, *, address: Callable[[], str], load: Callable[[], dict],
                 take_up: Callable[[dict], None], prepare: Callable[[], Awaitable[None]], begin: Callable[[], None],
                 spawn: Callable[[Coroutine], None], stop_tasks: Callable[[], None], elected_event: Callable[[], None]) -> None:
        """``load()``: the record on ZooKeeper (blocking); ``take_up(record)``: the coordinator's state becomes it;
        ``prepare()``: the checkpoint storage opened; ``begin()``: the leader's tasks started; ``spawn``/``stop_tasks``:
        background tasks started, all cancelled; ``elected_event()``: the event saying it leads."""
        self.election = election
        self.role = CoordinatorRole(alone=election is None)
        self._address, self._load, self._take_up, self._prepare, self._begin = address, load, take_up, prepare, begin
        self._spawn, self._stop_tasks, self._elected_event = spawn, stop_tasks, elected_event

    @property
    def leading(self) -> bool:
        return self.role.leading

    def elected(self) -> None:
        self._turn(self.role.elected())

    def reconnected(self) -> None:
        self._turn(self.role.reconnected())

    def deposed(self) -> None:
        self._stop_acting(self.role.deposed(), "deposed")

    def suspended(self) -> None:
        self._stop_acting(self.role.suspended(), "out of touch with ZooKeeper")

    def _turn(self, turn: int | None) -> None:
        if turn is not None:
            self._spawn(self._lead(turn))

    async def _lead(self, turn: int) -> None:
        try:
            saved = await asyncio.to_thread(self._load)
        except Exception as e:  # give the lead up rather than hold the lock without leading
            log.warning("coordinator %s could not load the control plane's documents (%s): it resigns", self._address(), e)
            if self.election is not None:  # (only an elected coordinator loads)
                self.election.resign()
            return
        if turn != self.role.turn:  # a later turn loads its own
            return
        self._take_up(saved)  # a standby's requests are refused, so taking the record up early is unseen
        await self._prepare()
        if not self.role.loaded(turn):  # deposed meanwhile
            return
        self._begin()
        self._elected_event()

    def _stop_acting(self, acting: bool, why: str) -> None:
        if acting:
            log.warning("coordinator %s stops leading: %s", self._address(), why)
            self._stop_tasks()

    def leader_only(self, handlers: dict[type, Handler]) -> dict[type, Handler]:
        """Each handler, answering ``NotLeaderError`` (naming the leader) while this coordinator does not lead."""
        def gated(handler: Handler) -> Handler:
            @functools.wraps(handler)
            async def leader_only(msg: Message, conn: Connection) -> Any:
                if not self.role.leading:
                    assert self.election is not None  # a coordinator alone always leads
                    raise await self.election.not_leader(self._address())
                return await handler(msg, conn)
            return leader_only

        return {cls: gated(handler) for cls, handler in handlers.items()}

    async def coordinators(self) -> dict:
        """The leader and the standbys (a single coordinator leads alone)."""
        if self.election is None:
            return {"leader": self._address(), "standbys": []}
        return await self.election.coordinators()
