"""``python -m favorites_maintenance`` is the ``favorites-maintenance`` command."""

from favorites_maintenance.cli import main

main()
