"""``python -m meshio``: the ``meshio`` command."""

from ._cli import main

main()
