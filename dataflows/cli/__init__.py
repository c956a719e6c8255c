"""The `trainguard` command line."""
