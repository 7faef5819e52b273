"""``python -m kiln``: the command line (the same as the ``kiln`` command)."""

from kiln.cli import run

run()
