"""A coordinator's role (control/leadership.py) and the way members and clients find the leader (cluster/leader.py)."""

import pytest

from rockstate.cluster.leader_channel import LeaderFinder, coordinator_addresses
from rockstate.control.leadership import CoordinatorRole, Phase
from rockstate.errors import ConnectionLostError, NotLeaderError, UnknownNodeError


def test_a_single_coordinator_leads_from_the_start():
    assert CoordinatorRole(alone=True).leading


def test_elected_it_leads_only_once_its_documents_are_loaded():
    role = CoordinatorRole(alone=False)
    assert not role.leading
    turn = role.elected()
    assert role.phase is Phase.LOADING and not role.leading
    assert role.loaded(turn) and role.leading


def test_deposed_while_loading_the_load_is_void():
    role = CoordinatorRole(alone=False)
    turn = role.elected()
    assert role.deposed() is True  # it was acting (loading): its tasks stop
    assert not role.loaded(turn) and role.phase is Phase.STANDING_BY
    assert role.reconnected() is None  # without the lock, a reconnection leads nothing


def test_out_of_touch_it_stops_and_leads_again_on_reconnection_while_it_holds_the_lock():
    role = CoordinatorRole(alone=False)
    role.loaded(role.elected())
    assert role.suspended() is True and not role.leading
    assert role.elected() is None  # no new turn while out of touch
    turn = role.reconnected()
    assert turn is not None and role.loaded(turn) and role.leading
    assert role.suspended() and role.deposed() is False  # already stopped: nothing more to stop


def test_the_finder_follows_a_redirect_and_goes_round_the_list_otherwise():
    finder = LeaderFinder(coordinator_addresses("10.0.0.1:7700, 10.0.0.2:7700,10.0.0.3:7700"))
    assert finder.current == "10.0.0.1:7700" and len(finder.turns()) == 7
    finder.failed(NotLeaderError("standby", leader="10.0.0.3:7700"))
    assert finder.current == "10.0.0.3:7700"
    finder.failed(ConnectionLostError("refused"))
    assert finder.current == "10.0.0.1:7700"
    finder.failed(NotLeaderError("an election is under way", leader=None))
    assert finder.current == "10.0.0.2:7700"
    finder.failed(NotLeaderError("standby", leader="10.0.0.9:7700"))  # one not in the list: learnt
    assert finder.current == "10.0.0.9:7700" and "10.0.0.9:7700" in finder.addresses
    with pytest.raises(UnknownNodeError):  # not about who leads: the caller's
        finder.failed(UnknownNodeError("register again"))
    assert finder.give_up(ConnectionLostError("x")).retryable


def test_one_address_keeps_a_plain_channels_errors_but_follows_a_redirect():
    finder = LeaderFinder(coordinator_addresses("10.0.0.1:7700"))
    with pytest.raises(ConnectionLostError):
        finder.failed(ConnectionLostError("refused"))
    finder.failed(NotLeaderError("standby", leader="10.0.0.2:7700"))
    assert finder.current == "10.0.0.2:7700"
