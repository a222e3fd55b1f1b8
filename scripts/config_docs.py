"""Regenerate docs/configuration.md from the settings models (tests check it is complete)."""

import inspect
import pathlib

from rockstate.cluster.client.backend import CLIENT_SETTINGS, connect
from rockstate.config import CheckpointConfig, CoordinatorConfig, NodeConfig, StoreConfig, settings

SECTIONS = [
    ("Coordinator", CoordinatorConfig, "`rockstate coordinator`"),
    ("Node", NodeConfig, "`rockstate node`"),
    ("Embedded store", StoreConfig, "`rockstate.open(path, **settings)`"),
    ("Checkpoints of an embedded store", CheckpointConfig, "`rockstate.open(path, checkpoints=CheckpointConfig(...) or URL)`"),
]

lines = [
    "# Configuration", "",
    "Every setting has a default. Settings come from, in order of precedence: command-line flags",
    "(`--memory-bytes 4GiB`: flags of sizes take units), `ROCKSTATE_<NAME>` environment variables, and a YAML file",
    "given with `--config`.",
    "Invalid values are refused with one plain `ConfigError` that names each bad field and what it got.",
    "The cluster secret is read from `secret_file` or `$ROCKSTATE_SECRET` and is never logged; clients and administrators may have secrets of their own (`client_secret_file`, `admin_secret_file`: docs/security.md).",
    "HTTP (the status page, its JSON API, every `/metrics`) takes its own read-only credential, `http_secret_file`, never an RPC secret;",
    "a cluster with a secret and no `http_secret_file` refuses every HTTP request (403). With `tls_cert_file` set, HTTP serves TLS too.",
    "S3 credentials and endpoint come from the standard AWS environment variables (`AWS_ENDPOINT_URL`, keys, region).", "",
    "Settings are flat wherever they are written. In Python, a config nests the configs of its parts:",
    "`CoordinatorConfig.checkpoints` is a `CheckpointConfig` (the `checkpoint*`, `retained_checkpoints` and",
    "`cluster_name` settings; None without a URL), `NodeConfig.store` a `StoreConfig` (`memory_bytes`,",
    "`ttl_sweep_interval`, `request_window`), and both have a `SecurityConfig` as `security` (`secret_file`,",
    "`tls_*_file`). A YAML file may give a nested config whole too (`security: {secret_file: ...}`).", "",
]
for title, model, where in SECTIONS:
    lines += [f"## {title} ({where})", "", "| setting | default | meaning |", "|---|---|---|"]
    nested = {name: f for name, f in model.model_fields.items() if name not in settings(model)}  # configs of its parts
    for name, f in {**settings(model), **nested}.items():
        default = f.default if f.default_factory is None else f.default_factory()
        lines.append(f"| `{name}` | `{default}` | {f.description} |")
    lines.append("")
lines += ["## Client (`rockstate.connect(address, **settings)`)", "",
          "A wrong address (no port), an address that is not a rockstate port (an HTTP or metrics port) and a TLS",
          "mismatch are reported at once as a `RockstateError` that says so; `help(rockstate.connect)` shows these too.", "",
          "| setting | default | meaning |", "|---|---|---|"]
defaults = inspect.signature(connect).parameters
for name, meaning in CLIENT_SETTINGS.items():
    lines.append(f"| `{name}` | `{defaults[name].default}` | {meaning} |")
lines.append("")
pathlib.Path(__file__).parent.parent.joinpath("docs", "configuration.md").write_text("\n".join(lines))
