"""One errors module with one root: every error class lives there, each with its own wire code."""

import importlib
import pkgutil

import pytest

import rockstate
from rockstate import errors
from rockstate.checkpoint.storage import CheckpointStorage


def every_error_class():
    for module in pkgutil.walk_packages(rockstate.__path__, "rockstate."):
        importlib.import_module(module.name)
    found, todo = set(), [errors.RockstateError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_class_is_in_errors_py_with_a_code_of_its_own():
    classes = every_error_class()
    assert {c.__module__ for c in classes} == {"rockstate.errors"}
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes)), "two classes share a wire code"
    assert set(errors.__all__) >= {c.__name__ for c in classes}


@pytest.mark.parametrize("cls", sorted(every_error_class(), key=lambda c: c.code), ids=lambda c: c.code)
def test_each_error_comes_back_from_the_wire_as_its_own_type(cls):
    sent = cls(f"partition 7 of order-events: {cls.__name__}", partition=7, state="order-events")
    back = errors.from_wire(sent.to_wire())
    assert type(back) is cls and back.message == sent.message and back.data == sent.data
    assert back.retryable == cls.retryable


def test_an_unknown_code_becomes_the_root_and_a_taken_code_is_refused():
    back = errors.from_wire({"code": "FROM_A_NEWER_VERSION", "message": "m", "data": {}})
    assert type(back) is errors.RockstateError and back.message == "m"
    with pytest.raises(TypeError, match="NOT_OWNER"):
        type("SecondNotOwner", (errors.ClusterError,), {"code": "NOT_OWNER"})


def test_deleting_outside_the_storage_is_a_typed_error(tmp_path):
    storage = CheckpointStorage(f"file://{tmp_path}/storage")
    try:
        with pytest.raises(errors.CheckpointPathError, match="refusing") as info:
            storage.delete(["../other-cluster/chk-000001/_metadata"])
        assert isinstance(info.value, ValueError) and info.value.code == "CHECKPOINT_PATH"
    finally:
        storage.close()
