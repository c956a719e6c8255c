"""Deprecated: the progress probe moved to :mod:`trainguard.probe`.

``from dataflows.probe import ProgressProbe`` keeps working for one release (0.2) and warns;
use ``from trainguard.probe import ProgressProbe``. This module is a namespace portion (there
is no ``dataflows/__init__.py`` in the distribution), so it never shadows another package
named ``dataflows``.
"""

import warnings

from trainguard.probe import HFProgressCallback, ProgressProbe, lightning_callback

warnings.warn(
    "dataflows.probe is deprecated and goes away in trainguard 0.3: import from trainguard.probe instead",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["HFProgressCallback", "ProgressProbe", "lightning_callback"]
