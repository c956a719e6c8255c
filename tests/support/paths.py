"""Where things are, for tests at any depth of the test tree."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED_DATASETS = ROOT.parent / "shared" / "datasets"
ARTIFACTS = ROOT / "test-artifacts"
