"""The one pattern for names that come from outside, and safe file creation from them.

Node ids, state names, savepoint names, upload ids and every file name read
from checkpoint storage, a move or a replica copy become path components on a
node. They are checked where they enter (the protocol's message classes, the
manifest parser, the receive side of a copy) against one pattern::

    [A-Za-z0-9][A-Za-z0-9_.-]{0,127}      and no ".."

1-128 letters, digits, ``_``, ``-`` or ``.``, starting with a letter or digit:
no path separator, no ``.``/``..``, no leading ``-`` (an option to a tool),
no markup brackets, no control characters. (``store/catalog.py`` checks state
names with the same pattern.)

A *relative path* from storage (``shared/p0042/000012-<uuid>.sst``) is such
names joined by ``/``. ``inside(dir, name)`` is the destination of a file
named ``name`` in ``dir``; ``create_new(path)`` creates it without following
a symlink and without replacing anything (``O_CREAT | O_EXCL | O_NOFOLLOW``).
"""

from __future__ import annotations

import os
import re

from .errors import InvalidNameError, UnsafePathError

PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}"
_NAME = re.compile(rf"^{PATTERN}\Z")
RULE = "1-128 letters, digits, '_', '-' or '.', starting with a letter or digit, with no '..' and no path separators"


def is_name(value: object) -> bool:
    return isinstance(value, str) and _NAME.match(value) is not None and ".." not in value


def check_name(value: object, what: str = "name") -> str:
    """``value`` if it is a valid name, else ``InvalidNameError`` naming ``what`` and the rule."""
    if not is_name(value):
        raise InvalidNameError(f"invalid {what} {_show(value)}: use {RULE}", what=what)
    return value  # type: ignore[return-value]


def check_optional(value: object, what: str = "name") -> str | None:
    return None if value is None else check_name(value, what)


def check_relative(path: object, what: str = "path") -> str:
    """A relative path of valid names joined by '/' (no leading '/', no '.', '..' or empty part)."""
    if not isinstance(path, str) or not path or len(path) > 1024 or not all(is_name(p) for p in path.split("/")):
        raise UnsafePathError(f"unsafe {what} {_show(path)}: a relative path of names ({RULE}) joined by '/'", what=what)
    return path


def inside(directory: str, name: object, what: str = "file name") -> str:
    """The path of the file ``name`` in ``directory``: ``name`` must be one valid path component."""
    if not is_name(name):
        raise UnsafePathError(f"unsafe {what} {_show(name)}: must be one path component ({RULE})", what=what)
    path = os.path.join(directory, name)  # type: ignore[arg-type]
    if os.path.dirname(path) != directory.rstrip(os.sep) and os.path.dirname(path) != directory:
        raise UnsafePathError(f"unsafe {what} {_show(name)}: not inside {directory!r}", what=what)
    return path


def check_base(base: object) -> str:
    """A folder checkpoint paths may be relative to: the cluster's own (``""``) or ``savepoints/<name>``; nothing else."""
    if base == "" or (isinstance(base, str) and base.startswith("savepoints/") and is_name(base[len("savepoints/"):])):
        return base  # type: ignore[return-value]
    from .errors import CheckpointPathError

    raise CheckpointPathError(f"checkpoint base {_show(base)} is not the cluster's folder nor savepoints/<name>", path=str(base)[:200])


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def create_new(path: str, mode: int = 0o644, exclusive: bool = True):
    """A file at ``path`` opened for binary writing; never follows a symlink; ``exclusive``: never replaces a file
    (else an existing regular file is truncated)."""
    flags = _CREATE if exclusive else (_CREATE & ~os.O_EXCL) | os.O_TRUNC
    return os.fdopen(os.open(path, flags, mode), "wb", buffering=0)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
