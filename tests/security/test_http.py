"""HTTP takes its own read-only credential, never the RPC secrets, and serves TLS when the cluster has a certificate
(issue 30 item 4): the coordinator's status page, /api/status, /healthz and /metrics, and a node's --metrics-port,
over real HTTP requests to real processes (and, for TLS and the closed case, a cluster in threads)."""

import base64
import contextlib
import json
import os
import socket
import ssl
import urllib.error
import urllib.request
from typing import Iterator

import pytest

from rockstate import LocalCluster
from rockstate.cluster.security import Security, client_context
from rockstate.config import NodeConfig, SecurityConfig
from rockstate.errors import ConfigError
from rockstate.local.cluster import wait_until
from tests.cluster.test_security import certs  # noqa: F401 -- the fixture

NODE_SECRET = "the node secret, never on HTTP"
HTTP_OLD, HTTP_NEW = "http-credential-old", "http-credential-new"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def basic(password: str, user: str = "prometheus") -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def get(url: str, headers: dict | None = None, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    """The status and body of GET ``url`` (an HTTP error's too)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def http_secret_file(path, *lines: str) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


@contextlib.contextmanager
def started(cluster: LocalCluster, http_file: str | None, metrics_port: int) -> Iterator[tuple[LocalCluster, str]]:
    """``cluster`` started with ``http_file`` as every process's HTTP credential, and one more node serving /metrics on
    ``metrics_port``; with the node's metrics URL. Stopped after the block."""
    if http_file is not None:
        cluster.security = cluster.security.model_copy(update={"http_secret_file": http_file})
    with cluster:
        cluster._runner.start_nodes([NodeConfig(coordinator=cluster.address, host="127.0.0.1", port=0, metrics_port=metrics_port,
                                                data_dir=os.path.join(cluster.root, "metered"), memory_bytes=64 << 20,
                                                security=cluster.security)])
        scheme = "https" if cluster.security.tls_cert_file else "http"
        yield cluster, f"{scheme}://127.0.0.1:{metrics_port}/metrics"


@pytest.fixture(scope="module")
def urls(tmp_path_factory):
    """A real coordinator process and a node process with a metrics port; the HTTP credential file holds two lines
    (a rotation); the cluster has a node secret."""
    root = tmp_path_factory.mktemp("http")
    http_file = http_secret_file(root / "http-secret", HTTP_OLD, HTTP_NEW)
    with started(LocalCluster(nodes=1, partitions=4, root=str(root / "cluster"), processes=True, secret=NODE_SECRET),
                 http_file, free_port()) as (cluster, node_metrics):
        base = cluster.status_url
        everything = {"page": base, "script": base + "static/app.js", "api": base + "api/status", "healthz": base + "healthz",
                      "coordinator metrics": base + "metrics", "node metrics": node_metrics}
        wait_until(lambda: get(node_metrics, basic(HTTP_OLD))[0] == 200, 30, "the node's metrics port")
        yield everything


def test_the_node_secret_is_refused_on_every_http_endpoint(urls):
    for name, url in urls.items():
        for headers in ({}, basic(NODE_SECRET), bearer(NODE_SECRET), basic("wrong"), {"Authorization": "Basic !!"}):
            status, body = get(url, headers)
            assert status == 401, (name, headers, status, body)
            assert "http_secret_file" in body and NODE_SECRET not in body
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert "Basic" in refused.value.headers["WWW-Authenticate"]  # a browser asks for the password


def test_the_http_credential_is_accepted_on_every_http_endpoint(urls):
    for name, url in urls.items():
        status, body = get(url, basic(HTTP_OLD))
        assert status == 200, (name, status, body)
    assert json.loads(get(urls["api"], basic(HTTP_OLD, user=""))[1])["partitions"] == 4
    assert json.loads(get(urls["healthz"], bearer(HTTP_OLD))[1])["verdict"] in ("healthy", "degraded")
    assert "rockstate_coordinator_partitions 4.0" in get(urls["coordinator metrics"], bearer(HTTP_OLD))[1]
    assert "rockstate_node_partitions" in get(urls["node metrics"], bearer(HTTP_OLD))[1]
    assert "<title>rockstate</title>" in get(urls["page"], basic(HTTP_OLD))[1]


def test_a_second_http_credential_is_accepted_during_a_rotation(urls):
    for name, url in urls.items():
        for headers in (basic(HTTP_NEW), bearer(HTTP_NEW), basic(HTTP_OLD)):
            assert get(url, headers)[0] == 200, (name, headers)


def test_without_an_http_credential_a_cluster_with_a_secret_refuses_every_http_request(tmp_path):
    with started(LocalCluster(nodes=1, partitions=2, root=str(tmp_path), processes=False, secret=NODE_SECRET),
                 None, free_port()) as (cluster, node_metrics):
        base = cluster.status_url
        for url in (base, base + "api/status", base + "metrics", base + "healthz", node_metrics):
            for headers in ({}, basic(NODE_SECRET), bearer(NODE_SECRET)):
                status, body = get(url, headers)
                assert status == 403 and "HTTP is closed" in body and "http_secret_file" in body, (url, status, body)
        with cluster.connect() as rs:  # the RPC ports are not affected
            rs.value_state("still").put("k", 1)
            assert rs.value_state("still").get("k") == 1


def test_an_rpc_secret_cannot_be_the_http_credential(tmp_path):
    node = http_secret_file(tmp_path / "node", NODE_SECRET)
    client = http_secret_file(tmp_path / "client", "client secret")
    for shared in (NODE_SECRET, "client secret"):
        http = http_secret_file(tmp_path / "http", HTTP_NEW, shared)
        with pytest.raises(ConfigError, match="http_secret_file"):
            Security.from_config(SecurityConfig(secret_file=node, client_secret_file=client, http_secret_file=http))
    security = Security.from_config(SecurityConfig(secret_file=node, http_secret_file=http_secret_file(tmp_path / "ok", HTTP_NEW)))
    assert security.http_secrets == (HTTP_NEW.encode(),) and HTTP_NEW not in repr(security)
    assert security.http_refusal(bearer(HTTP_NEW)["Authorization"]) is None
    assert security.http_refusal(bearer(NODE_SECRET)["Authorization"])[0] == 401
    assert Security().http_refusal("") is None  # no secrets at all: HTTP is open, as the RPC ports are


def test_http_serves_tls_with_the_clusters_certificate(tmp_path, certs):  # noqa: F811 -- the fixture
    http_file = http_secret_file(tmp_path / "http-secret", HTTP_NEW)
    with started(LocalCluster(nodes=1, partitions=2, root=str(tmp_path), processes=False, secret=NODE_SECRET,
                              tls=certs), http_file, free_port()) as (cluster, node_metrics):
        ca = client_context(certs["ca"])
        assert cluster.status_url.startswith("https://127.0.0.1:") and node_metrics.startswith("https://")
        status, body = get(cluster.status_url + "api/status", basic(HTTP_NEW), ca)
        assert status == 200 and json.loads(body)["partitions"] == 2
        assert get(cluster.status_url + "metrics", bearer(HTTP_NEW), ca)[0] == 200
        assert get(cluster.status_url + "metrics", bearer(NODE_SECRET), ca)[0] == 401
        status, body = get(node_metrics, bearer(HTTP_NEW), ca)
        assert status == 200 and "rockstate_node_partitions" in body
        assert get(node_metrics, bearer(NODE_SECRET), ca)[0] == 401
        for url in (cluster.status_url + "metrics", node_metrics):
            with pytest.raises(urllib.error.URLError):  # a client that does not trust the cluster's CA
                urllib.request.urlopen(urllib.request.Request(url, headers=bearer(HTTP_NEW)), timeout=10,
                                       context=ssl.create_default_context())
            with pytest.raises((urllib.error.URLError, ConnectionError, http_client_errors())):  # plain HTTP: no answer
                urllib.request.urlopen(urllib.request.Request(url.replace("https://", "http://"), headers=bearer(HTTP_NEW)), timeout=10)


def http_client_errors() -> type:
    import http.client

    return http.client.HTTPException
