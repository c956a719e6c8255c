"""Benchmarks and evaluation harnesses that run the real flow, the agents or the tests' broker:
``trainguard bench …``. The simulator, the sample data and scoring stay in ``trainguard.datasets``."""
