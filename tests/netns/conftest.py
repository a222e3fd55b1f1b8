"""Hosts on this machine (``rockstate.testing.netns``): skipped only where the kernel refuses network namespaces."""

import pytest

from rockstate.testing import netns


@pytest.fixture
def network():
    why = netns.refused()
    if why:
        pytest.skip(why)
    with netns.Network() as net:
        yield net
