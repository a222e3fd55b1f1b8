"""The coordinator's HTTP server: the status page (``/``), its JSON API and the coordinator's Prometheus metrics.

    GET /               the status page (static files in this package: no CDN, works offline)
    GET /api/status     the cluster's status (``status.cluster_status``), as ``rockstate status --json`` prints it;
                        a standby coordinator answers 503 with the leader's address
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
"""

from __future__ import annotations

import logging
import os
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ...health import HTTP, summarize
from ...security import Security

log = logging.getLogger(__name__)

STATIC = os.path.join(os.path.dirname(__file__), "static")


class StatusServer:
    def __init__(self, security: Security, registry: CollectorRegistry, *, leading: Callable[[], bool],
                 status: Callable[[], Awaitable[dict]], coordinators: Callable[[], Awaitable[dict]]) -> None:
        """``security``: the HTTP credentials and the TLS context; ``registry``: the coordinator's metrics;
        ``leading()``: whether it leads; ``status()``: the cluster's status document; ``coordinators()``: the leader
        and the standbys."""
        self.security, self.registry = security, registry
        self._leading, self._status, self._coordinators = leading, status, coordinators
        self.url: str | None = None
        self._runner: web.AppRunner | None = None

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._authorize])
        app.router.add_get("/", self.page)
        app.router.add_get("/api/status", self.status)
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
        return await handler(request)

    async def page(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(os.path.join(STATIC, "index.html"), headers={"Cache-Control": "no-cache"})

    async def status(self, request: web.Request) -> web.Response:
        if not self._leading():  # a standby's state is not the cluster's: it names the leader instead
            return web.json_response({"leading": False, "coordinators": await self._coordinators()}, status=503,
                                     headers={"Cache-Control": "no-store"})
        return web.json_response(await self._status(), headers={"Cache-Control": "no-store"})

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

