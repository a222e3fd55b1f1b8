"""The cluster's operations: one message class per operation, by role.

Data operations name the client's table ``epoch``: a node refuses (NOT_OWNER)
a request for a partition it does not own, or whose epoch is older than the
epoch at which the node became the partition's owner (fencing clients that
still route by a table from before a move). Reads and scans are safe to
retry; a ``Write`` or ``CompareAndSet`` carrying a ``request`` id is applied
once however often it is sent (see ``store/requests.py``).

Numeric fields with a range (a scan's limit, batch and task numbers,
checkpoint ids, offsets, waits) name it in ``ranges``; a message out of range
is refused with a ``ProtocolError`` that names the field and what is allowed,
when it is made and when it is decoded.
"""

from .base import I64, MAX_SCAN_LIMIT, U32, U64  # noqa: F401
from .coordinator import *  # noqa: F401,F403 -- every message class, as protocol.<Name>
from .data import *  # noqa: F401,F403
from .node import *  # noqa: F401,F403
from . import roles as _roles  # noqa: E402,F401 -- every message class gets the roles it needs
