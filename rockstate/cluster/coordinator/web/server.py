"""The coordinator's HTTP server: the status page (``/``), its JSON API and the coordinator's Prometheus metrics.

    GET /               the status page (static files in this package: no CDN, works offline)
    GET /api/status     the cluster's status (``status.cluster_status``), as ``rockstate status --json`` prints it;
                        a standby coordinator answers 503 with the leader's address (as do the two below)
    GET /api/events     the recent events (``status.events_document``), newest last: ``?type=T`` (repeated, or T1,T2)
                        only those types, ``?limit=N`` (1-1000, default 100) the last N of them; with each type's count
    GET /api/load       each node's throughput and latency over the last minutes (``load.LoadHistory``)
    GET /metrics        the coordinator's Prometheus metrics
    GET /healthz        the cluster's health verdict as JSON (``cluster/health.py``, what ``rockstate status``
                        exits with): 200 ``{"verdict": "healthy"}`` or ``{"verdict": "degraded", "reasons": [...]}``,
                        503 ``{"verdict": "unavailable", ...}``; a standby coordinator answers 503 with the leader
    GET /livez          "ok" while the coordinator serves (a liveness probe: not the cluster's health)

Every request must carry the HTTP credential (``http_secret_file``, read-only; any of its lines) when one is
configured: HTTP basic auth with any user name and the credential as password (a browser asks for it), or
``Authorization: Bearer <credential>``. The cluster's RPC secrets are never accepted here; a cluster with a secret
and no HTTP credential answers every request 403 (``Security.http_refusal``). With a TLS certificate configured the
server speaks HTTPS, with the RPC ports' certificate.

A query string is checked before use (``event_query``): a malformed one is answered 400 with the typed error's code
and message, and the server serves on.
"""

from __future__ import annotations

import logging
import os
from typing import Awaitable, Callable

from aiohttp import web
from multidict import MultiMapping
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ....errors import InvalidInputError
from ...health import HTTP, summarize
from ...security import Security
from .status import EVENT_TYPE, events_document

log = logging.getLogger(__name__)

STATIC = os.path.join(os.path.dirname(__file__), "static")
MAX_EVENTS = 1000  # the most ``limit`` may ask: the event log keeps as many
MAX_TYPES = 50


def event_query(query: MultiMapping[str]) -> tuple[set[str] | None, int]:
    """``/api/events``'s (types, limit) from its query string; ``InvalidInputError`` for anything else in it."""
    unknown = set(query) - {"type", "limit"}
    if unknown:
        raise InvalidInputError(f"unknown query parameter {sorted(unknown)[0][:40]!r}: /api/events takes type and limit")
    types: set[str] | None = None
    if "type" in query:
        types = {t for value in query.getall("type") for t in value.split(",")}
        bad = sorted(t for t in types if not EVENT_TYPE.match(t))
        if bad:
            raise InvalidInputError(f"invalid event type {bad[0][:40]!r}: lower-case letters, digits and '_'")
        if len(types) > MAX_TYPES:
            raise InvalidInputError(f"at most {MAX_TYPES} event types, not {len(types)}")
    limit = query.get("limit", "100")
    if not (limit.isascii() and limit.isdigit() and len(limit) <= 4 and 1 <= int(limit) <= MAX_EVENTS):
        raise InvalidInputError(f"limit must be a whole number from 1 to {MAX_EVENTS}, not {limit[:40]!r}")
    return types, int(limit)


class StatusServer:
    def __init__(self, security: Security, registry: CollectorRegistry, *, leading: Callable[[], bool],
                 status: Callable[[], Awaitable[dict]], coordinators: Callable[[], Awaitable[dict]],
                 events: Callable[[], list[dict]], load: Callable[[], dict]) -> None:
        """``security``: the HTTP credentials and the TLS context; ``registry``: the coordinator's metrics;
        ``leading()``: whether it leads; ``status()``: the cluster's status document; ``coordinators()``: the leader
        and the standbys; ``events()``: the events kept, oldest first; ``load()``: the nodes' load history."""
        self.security, self.registry = security, registry
        self._leading, self._status, self._coordinators = leading, status, coordinators
        self._events, self._load = events, load
        self.url: str | None = None
        self._runner: web.AppRunner | None = None

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._authorize])
        app.router.add_get("/", self.page)
        app.router.add_get("/api/status", self.status)
        app.router.add_get("/api/events", self.events)
        app.router.add_get("/api/load", self.load)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/livez", self.livez)
        app.router.add_static("/static/", STATIC)
        return app

    async def start(self, host: str, port: int) -> str:
        self._runner = web.AppRunner(self._app(), access_log=None)
        await self._runner.setup()
        tls = self.security.server_ssl
        await web.TCPSite(self._runner, host, port, ssl_context=tls).start()
        bound = self._runner.addresses[0][1]
        self.url = f"{'https' if tls else 'http'}://{host}:{bound}/"
        log.info("status page on %s", self.url)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _authorize(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        refusal = self.security.http_refusal(request.headers.get("Authorization", ""))
        if refusal is not None:
            status, text, headers = refusal
            return web.Response(status=status, text=text, headers=headers)
        try:
            return await handler(request)
        except InvalidInputError as e:  # what the request asked for is malformed: say what, serve on
            return web.json_response({"error": e.code, "message": str(e)}, status=400)

    async def page(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(os.path.join(STATIC, "index.html"), headers={"Cache-Control": "no-cache"})

    async def _standby(self) -> web.Response | None:
        """A standby's state is not the cluster's: 503 naming the leader instead (None: this one leads)."""
        if self._leading():
            return None
        return web.json_response({"leading": False, "coordinators": await self._coordinators()}, status=503,
                                 headers={"Cache-Control": "no-store"})

    async def status(self, request: web.Request) -> web.Response:
        return await self._standby() or web.json_response(await self._status(), headers={"Cache-Control": "no-store"})

    async def events(self, request: web.Request) -> web.Response:
        types, limit = event_query(request.query)  # before the leadership: a bad query is the caller's on any coordinator
        return await self._standby() or web.json_response(events_document(self._events(), types, limit),
                                                          headers={"Cache-Control": "no-store"})

    async def load(self, request: web.Request) -> web.Response:
        return await self._standby() or web.json_response(self._load(), headers={"Cache-Control": "no-store"})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        """The verdict ``rockstate status`` exits with: 200 healthy or degraded (the body tells which), 503 unavailable."""
        headers = {"Cache-Control": "no-store"}
        if not self._leading():
            return web.json_response({"verdict": None, "leading": False, "coordinators": await self._coordinators(),
                                      "reasons": ["a standby coordinator: ask the leader"]}, status=503, headers=headers)
        summary = summarize(await self._status())
        health = {k: summary[k] for k in ("verdict", "exit_code", "reasons", "nodes", "partitions", "without_live_owner",
                                          "waiting_for_election", "failovers", "leader")}
        health["short_of_in_sync_backups"] = len(summary["short_of_in_sync_backups"])
        health["moves_in_flight"] = len(summary["moves"])
        return web.json_response(health, status=HTTP[summary["verdict"]], headers=headers)

    async def livez(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

