"""A coordinator's part in the election, with ``--zookeeper``: its session, its leadership, its documents.

``Election`` carries ZooKeeper's news (kazoo's threads) to the coordinator's
event loop, in the order it came: elected, deposed (the session ended, or a
write was refused: it resigns and contends again), suspended and reconnected.
The coordinator asks ``control/leadership.py`` what each means. Everything the
coordinator keeps goes through ``persistence.ZooKeeperDocuments``, fenced by
this leadership.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from kazoo.client import KazooState

from ...config import CoordinatorConfig
from ...errors import NotLeaderError, ZooKeeperError
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

        def post(event: str):  # from kazoo's threads, in order, to the loop
            return lambda *_: loop.call_soon_threadsafe(getattr(contender, event))

        self.store = await asyncio.to_thread(
            ZooKeeperStore, self.config.zookeeper, zookeeper_cluster(self.config),
            timeout=max(self.config.zookeeper_session_timeout, 2.0), session_timeout=self.config.zookeeper_session_timeout)
        self.leadership = self.store.leadership(identifier, on_elected=post("elected"), on_deposed=post("deposed"))
        states = {KazooState.LOST: post("deposed"), KazooState.SUSPENDED: post("suspended"),
                  KazooState.CONNECTED: post("reconnected")}
        self._listener = lambda state: states[state]()
        self.store.client.add_listener(self._listener)
        self.contender = contender
        documents = ZooKeeperDocuments(self.store, self.leadership, lambda error: self.resign())
        self.leadership.start()
        log.info("coordinator %s contends for leadership on ZooKeeper %s", identifier, self.config.zookeeper)
        return documents

    def resign(self) -> None:
        """Stop acting now (a write was refused, or the documents could not be read) and contend again."""
        self.contender.deposed()
        self.leadership.resign()

    async def coordinators(self) -> dict:
        """Who leads and who stands by, as ZooKeeper's election says."""
        try:
            if self.leadership is None or not self.store.client.connected:
                raise ZooKeeperError("not in touch with ZooKeeper" if self.leadership else "not contending yet")
            contenders = await asyncio.to_thread(self.leadership.contenders)
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
