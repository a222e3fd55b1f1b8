"""The control plane's store on ZooKeeper: named JSON documents and the election of the leading coordinator.

Everything lives under one root, ``/rockstate/<cluster>``::

    /rockstate/<cluster>/docs/<name>     a JSON document (the table, membership, ...); over 64 KiB, zlib-compressed
    /rockstate/<cluster>/leader/...      the election: one ephemeral sequential znode per contender

A document is read with its ZooKeeper version and written back naming it: a
write over a newer version raises ``StaleVersionError`` (someone else wrote
since). A write ``fence``\\ d by a ``Leadership`` is one ZooKeeper transaction
that also checks the leader's own election znode: once the leader's session has
ended (its znode went with it) its writes fail with ``NotLeaderError``, even
before it learns it was deposed.

Calls block (kazoo's threads carry the I/O); an asyncio server calls them
through ``asyncio.to_thread``. Each call waits at most ``timeout`` seconds;
kazoo's errors come out as typed ``ZooKeeperError``\\ s.

ACLs (docs/security.md): a store opened with ``auth`` (``"user:password"``,
ZooKeeper's digest scheme; a coordinator's comes from ``coordinator_auth``)
authenticates its session and creates every znode — the root, documents, the
election's — with an ACL that gives that user every right and everyone else
only READ (``/rockstate`` itself also CREATE, so clusters with other
credentials can make their roots beside). It sets that ACL on the cluster's
znodes that exist already too (made before ACLs). Nodes and clients follow
the leader with a store without ``auth``: they read, and a write, delete or
create of theirs is refused (``ZooKeeperError``: NoAuthError). Without
``auth`` znodes are created open, as before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import hashlib
import hmac

from kazoo.client import KazooClient, KazooState
from kazoo.security import ACL, Id, Permissions, make_digest_acl
from kazoo.exceptions import (BadVersionError, CancelledError, ConnectionClosedError, ConnectionLoss, KazooException,
                              NodeExistsError, NoNodeError, OperationTimeoutError, RolledBackError, SessionExpiredError)

from ..errors import NotLeaderError, SizeLimitError, StaleVersionError, ZooKeeperError, ZooKeeperUnavailableError
from ..store.catalog import check_name

log = logging.getLogger(__name__)

MAX_DOCUMENT = 1_000_000  # bytes; ZooKeeper's default jute.maxbuffer is 1 MiB per znode
COMPRESS_OVER = 64 * 1024  # bytes of JSON above which a document is kept zlib-compressed (a big P's table: ~20x smaller)
ZLIB = b"z"  # the first byte of a compressed document; JSON's is "{"
RECONNECT = {"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": 1.0}
_CONTENDER = re.compile(r"__lock__(\d{10})$")  # kazoo's lock recipe names its znodes so, with their sequence number
_UNAVAILABLE = (ConnectionLoss, ConnectionClosedError, OperationTimeoutError, SessionExpiredError)


PROCESS_AUTH: Any = object()  # ZooKeeperStore's default auth: the process's (set_process_auth)
_process_auth: list[str | None] = [None]


@dataclass(frozen=True)
class Document:
    data: dict
    version: int  # the znode's version; a write names the version it read


class ZooKeeperStore:
    def __init__(self, hosts: str, cluster: str, timeout: float = 10.0, session_timeout: float = 10.0,
                 auth: str | None | object = PROCESS_AUTH, readonly: bool = False) -> None:
        """Connect to ``hosts`` (``host:port[,host:port...]``) and make the cluster's root if it is new.

        ``auth``: ``"user:password"`` (digest): this session writes, everyone else only reads (see above); by
        default the process's (``set_process_auth``: a coordinator's, from its node secret); None: none.
        ``readonly``: a follower's store, which creates nothing."""
        if auth is PROCESS_AUTH:
            auth = _process_auth[0]
        assert auth is None or isinstance(auth, str)
        self.hosts, self.timeout = hosts, timeout
        self.root = f"/rockstate/{check_name(cluster, 'cluster')}"
        self._contenders: list[Leadership] = []
        self.acl = acl_for(auth) if auth else None
        # reconnect at least every second: kazoo's default backoff (up to an hour) would outlast the session
        self.client = KazooClient(hosts, timeout=session_timeout, connection_retry=RECONNECT,
                                  auth_data=[("digest", auth)] if auth else None, default_acl=self.acl)
        with self._translated("connecting"):
            self.client.start(timeout=timeout)
        try:
            if not readonly:
                with self._translated("creating the cluster's root"):
                    if self.acl is not None:
                        self._lock_down()
                    self.client.ensure_path(f"{self.root}/docs")
        except BaseException:
            self.close()
            raise

    def _lock_down(self) -> None:
        """The ACL on the cluster's znodes (``/rockstate``: also CREATE for everyone), those made before it too."""
        assert self.acl is not None
        parent = [*self.acl, ACL(Permissions.READ | Permissions.CREATE, Id("world", "anyone"))]
        if self.client.exists("/rockstate") is None:
            with contextlib.suppress(NodeExistsError):
                self.client.create("/rockstate", acl=parent)
        for path in (self.root, f"{self.root}/docs", f"{self.root}/leader"):
            if self.client.exists(path) is None:
                with contextlib.suppress(NodeExistsError):
                    self.client.create(path, acl=self.acl)
        for path in [self.root, f"{self.root}/docs", f"{self.root}/leader",
                     *(f"{self.root}/docs/{d}" for d in self.client.get_children(f"{self.root}/docs"))]:
            acls, _ = self.client.get_acls(path)
            if list(acls) != list(self.acl):  # made before ACLs, or by another credential (refused: NoAuth)
                self.client.set_acls(path, self.acl)

    def _path(self, name: str) -> str:
        return f"{self.root}/docs/{check_name(name, 'document')}"

    @contextlib.contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        try:
            yield
        except (*_UNAVAILABLE, self.client.handler.timeout_exception) as e:
            raise ZooKeeperUnavailableError(
                f"ZooKeeper at {self.hosts} did not answer {what} within {self.timeout:g}s ({type(e).__name__}): "
                "check that it runs and is reachable; a write may or may not have happened, so read again") from e
        except BadVersionError as e:
            raise StaleVersionError(f"{what}: the document changed since it was read (another coordinator wrote it); "
                                    "read it again, and stop if this coordinator no longer leads") from e
        except NodeExistsError as e:
            raise StaleVersionError(f"{what}: the document exists already (another coordinator created it); "
                                    "read it and write with its version") from e
        except KazooException as e:
            raise ZooKeeperError(f"ZooKeeper at {self.hosts} refused {what}: {type(e).__name__} {e}") from e

    # -- documents -----------------------------------------------------------

    def read(self, name: str) -> Document | None:
        """The document and its version; None when it was never written."""
        with self._translated(f"reading {name!r}"):
            try:
                raw, stat = self.client.get_async(self._path(name)).get(timeout=self.timeout)
            except NoNodeError:
                return None
        return Document(json.loads(zlib.decompress(raw[1:]) if raw[:1] == ZLIB else raw), stat.version)

    def write(self, name: str, data: dict, version: int | None, fence: "Leadership | None" = None) -> Document:
        """Replace the document at ``version`` (None: create it); answers it with its new version.

        ``fence``: the write happens only while that contender leads.
        """
        return self.write_many({name: (data, version)}, fence)[name]

    def write_many(self, documents: dict[str, tuple[dict, int | None]], fence: "Leadership | None" = None) -> dict[str, Document]:
        """Replace several documents in one transaction (all or none), each ``name: (data, version it read)``."""
        raws = {}
        for name, (data, _) in documents.items():
            raw = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
            raws[name] = raw = ZLIB + zlib.compress(raw) if len(raw) > COMPRESS_OVER else raw
            if len(raw) > MAX_DOCUMENT:
                raise SizeLimitError(f"document {name!r} is {len(raw)} bytes, over ZooKeeper's {MAX_DOCUMENT}: "
                                     "split it into several documents")
        what = "writing " + ", ".join(f"{name!r} at version {version}" for name, (_, version) in documents.items())
        with self._translated(what):
            tx = self.client.transaction()
            if fence is not None:
                node = fence.node
                if node is None:
                    raise fence.not_leader(what)
                tx.check(node, -1)  # the leader's election znode still exists: its session is alive
            for name, (_, version) in documents.items():
                path = self._path(name)
                tx.create(path, raws[name]) if version is None else tx.set_data(path, raws[name], version)
            results = tx.commit_async().get(timeout=self.timeout)
            if fence is not None and isinstance(results[0], NoNodeError):
                raise fence.not_leader(what)
            failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
            if failed:
                raise failed[0]
            written = results[1:] if fence is not None else results
            return {name: Document(data, 0 if version is None else stat.version)
                    for (name, (data, version)), stat in zip(documents.items(), written)}

    def names(self) -> list[str]:
        with self._translated("listing the documents"):
            return sorted(self.client.get_children_async(f"{self.root}/docs").get(timeout=self.timeout))

    # -- leadership -----------------------------------------------------------

    def leadership(self, identifier: str, on_elected: Callable[[], None] = lambda: None,
                   on_deposed: Callable[[], None] = lambda: None) -> "Leadership":
        """A contender in the election of the cluster's leader (``start()`` it); ``identifier`` is what
        the others see of it (a coordinator's address, so standbys can point to the leader)."""
        leadership = Leadership(self, identifier, on_elected, on_deposed)
        self._contenders.append(leadership)
        return leadership

    def contenders(self) -> list[str]:
        """The identifiers of the election's contenders (coordinators' addresses), the leader first.

        As kazoo's ``Lock.contenders``, but each read waits at most ``timeout`` (kazoo's waits for a
        reconnection however long it takes)."""
        path = f"{self.root}/leader"
        with self._translated("listing the election's contenders"):
            try:
                children = self.client.get_children_async(path).get(timeout=self.timeout)
            except NoNodeError:
                return []
            queued = sorted((m.group(1), child) for child in children if (m := _CONTENDER.search(child)))
            reads = [self.client.get_async(f"{path}/{child}") for _, child in queued]
            identifiers = []
            for read in reads:
                try:
                    data, _ = read.get(timeout=self.timeout)
                except NoNodeError:  # it left meanwhile
                    continue
                identifiers.append(data.decode())
            return identifiers

    def close(self) -> None:
        """Leave the election and end the session: its ephemeral znodes go at once (a successor takes over now)."""
        for leadership in self._contenders:
            leadership.stop()
        try:
            self.client.stop()
        finally:
            self.client.close()

    def __enter__(self) -> "ZooKeeperStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def set_process_auth(secret: bytes | None) -> None:
    """The ZooKeeper credential this process's stores use by default: derived from its node secret
    (``Security.from_config`` sets it, so a coordinator authenticates without a setting of its own)."""
    _process_auth[0] = coordinator_auth(secret)


def acl_for(auth: str) -> list:
    """Every right to the digest user of ``auth`` (``"user:password"``), READ to everyone."""
    user, _, password = auth.partition(":")
    if not user or not password:
        raise ValueError("ZooKeeper auth is 'user:password'")
    return [make_digest_acl(user, password, all=True), ACL(Permissions.READ, Id("world", "anyone"))]


def coordinator_auth(secret: bytes | None, auth_file: str | None = None) -> str | None:
    """The coordinators' ZooKeeper credential: ``auth_file``'s first line (``user:password``), else one derived from
    the node secret (every coordinator of the cluster holds it; nodes and clients follow without it), else None."""
    if auth_file:
        with open(auth_file) as f:
            return f.readline().strip() or None
    if not secret:
        return None
    return "rockstate-coordinator:" + hmac.new(bytes(secret), b"rockstate zookeeper digest v1", hashlib.sha256).hexdigest()


class Leadership:
    """One contender: it stands by until kazoo's lock recipe elects it, then leads until its session ends.

    Transitions (one thread per contender runs them)::

        STANDING_BY ── the lock is ours (on_elected) ──▶ LEADING
        LEADING ── the session is lost, or resign() (on_deposed) ──▶ STANDING_BY (a new contender, queued behind the others)
        any ── stop() ──▶ STOPPED (a leader's znode is deleted: a standby takes over at once)

    A suspended connection does not depose: the session may still be alive
    and ZooKeeper keeps the lock until it expires; the fence on writes is what
    keeps a leader that lost its session from writing.
    """

    def __init__(self, store: ZooKeeperStore, identifier: str, on_elected: Callable[[], None],
                 on_deposed: Callable[[], None]) -> None:
        self.store, self.identifier = store, identifier
        self.path = f"{store.root}/leader"
        self.on_elected, self.on_deposed = on_elected, on_deposed
        self.node: str | None = None  # our election znode while we lead
        self._lock: Any = None  # kazoo's lock recipe, a new one per turn in the election
        self._guard = threading.Lock()  # stop() and a new turn do not interleave
        self._deposed = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._contend, name=f"election-{identifier}", daemon=True)
        store.client.add_listener(self._session_changed)

    @property
    def leading(self) -> bool:
        return self.node is not None

    def contenders(self) -> list[str]:
        """Every contender's identifier, the leader first."""
        return self.store.contenders()

    def leader(self) -> str | None:
        return next(iter(self.contenders()), None)

    def standbys(self) -> list[str]:
        return self.contenders()[1:]

    def not_leader(self, what: str) -> NotLeaderError:
        try:
            leader = self.leader()
        except ZooKeeperError:
            leader = None
        return NotLeaderError(f"{what}: {self.identifier} does not lead (its ZooKeeper session ended or it stands by); "
                              f"the leader is {leader or 'not elected yet'}", leader=leader)

    def start(self) -> "Leadership":
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._guard:
            self._stopped.set()
            self._deposed.set()
            if self._lock is not None:
                self._lock.cancel()
        if self._thread.is_alive():
            self._thread.join()
        self.store.client.remove_listener(self._session_changed)

    def resign(self) -> None:
        """Give up leading (its writes were refused); ``on_deposed`` runs and it contends again, behind the others."""
        if self.leading:
            self._deposed.set()

    def _session_changed(self, state: str) -> None:  # on kazoo's thread: must not block
        if state == KazooState.LOST:
            self._deposed.set()

    def _contend(self) -> None:
        client = self.store.client
        while True:
            with self._guard:
                if self._stopped.is_set():
                    return
                self._lock = client.Lock(self.path, self.identifier)
            try:
                self._lock.acquire()
                with self._guard:
                    if not self._stopped.is_set():
                        self._deposed.clear()  # a session lost while standing by is checked just below
                node = f"{self.path}/{self._lock.node}"
                stat = client.exists(node)
            except CancelledError:
                return
            except KazooException as e:
                log.warning("%s: the election failed (%s); contending again", self.identifier, e)
                self._stopped.wait(0.2)
                continue
            if stat is None or stat.ephemeralOwner != client.client_id[0]:  # won in a session that ended since
                with contextlib.suppress(KazooException):
                    self._lock.release()
                continue
            self.node = node
            log.info("%s leads", self.identifier)
            self._call(self.on_elected)
            self._deposed.wait()
            self.node = None
            with contextlib.suppress(KazooException):  # a lost session took the znode with it
                self._lock.release()
            if not self._stopped.is_set():
                log.warning("%s was deposed: its ZooKeeper session ended", self.identifier)
                self._call(self.on_deposed)

    def _call(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("%s: a leadership callback failed", self.identifier)
