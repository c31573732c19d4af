"""``python -m conveyor.cli``: the ``conveyor`` command."""

from conveyor.cli import main

main()
