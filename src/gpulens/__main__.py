"""`python -m gpulens`: the same as the `gpulens` command."""

from gpulens.cli.main import run

run()
