"""`python -m trainguard.dataflows` runs the command line (as `trainguard` and `python -m trainguard.cli` do)."""

from trainguard.cli.app import main

main()
