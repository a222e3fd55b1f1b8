"""``python -m rockstate.cli``: the ``rockstate`` command."""

from . import main

main()
