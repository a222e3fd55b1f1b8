"""The coordinator's status page, JSON API and Prometheus endpoint (one HTTP server, see ``server``)."""

from .server import StatusServer
from .status import cluster_status

__all__ = ["StatusServer", "cluster_status"]
