"""Settings: validated, loadable from YAML and the environment, and documented."""

import pathlib

import pytest

from rockstate.config import CheckpointConfig, CoordinatorConfig, NodeConfig, StoreConfig, load
from rockstate.errors import ConfigError

DOC = (pathlib.Path(__file__).parent.parent / "docs" / "configuration.md").read_text()


@pytest.mark.parametrize("model", [CoordinatorConfig, NodeConfig, StoreConfig, CheckpointConfig])
def test_every_setting_is_documented_with_its_default(model):
    for name, field in model.model_fields.items():
        default = field.default if field.default_factory is None else field.default_factory()
        assert f"| `{name}` | `{default}` |" in DOC, f"{model.__name__}.{name} is not in docs/configuration.md"


def test_yaml_then_environment_then_overrides(tmp_path, monkeypatch):
    path = tmp_path / "node.yaml"
    path.write_text("memory_bytes: 100000000\nheartbeat_interval: 2.0\nport: 1234\n")
    monkeypatch.setenv("ROCKSTATE_HEARTBEAT_INTERVAL", "3.5")
    config = load(NodeConfig, str(path), port=4321)
    assert (config.memory_bytes, config.heartbeat_interval, config.port) == (100_000_000, 3.5, 4321)


def test_bad_values_are_shown_plainly():
    with pytest.raises(ConfigError) as info:
        load(NodeConfig, None, port=70000, memory_bytes="lots")
    message = str(info.value)
    assert "port" in message and "70000" in message
    assert "memory_bytes" in message and "lots" in message


def test_unknown_setting_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("partitons: 12\n")
    with pytest.raises(ConfigError, match="partitons"):
        load(CoordinatorConfig, str(path))
