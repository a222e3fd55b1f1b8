"""``python -m rockstate.cli``: the ``rockstate`` command."""

from . import main

if __name__ == "__main__":  # importing the module (tests import every module) runs nothing
    main()
