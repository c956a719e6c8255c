"""Pure-Python detectors: event types, parsers, detectors and attribution.

Nothing here imports Bytewax or does I/O, so every detector can be unit-tested
in microseconds and embedded in any stream engine.
"""
