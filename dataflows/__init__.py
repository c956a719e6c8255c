"""The Bytewax side of trainguard: sources, sinks, the dataflow and the CLI.

Only this package imports Bytewax; detectors and actions stay engine-free.
"""
