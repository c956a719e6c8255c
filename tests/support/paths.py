"""Where things are, for tests at any depth of the test tree."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED_DATASETS = ROOT.parent / "shared" / "datasets"
ARTIFACTS = ROOT / "test-artifacts"
THIRD_PARTY = FIXTURES / "third_party"


def reference_data(shared: str, copied: str | None = None) -> Path:
    """A public data file: the small copy in ``tests/fixtures/third_party`` when there is one (a plain
    clone has it), else its place in ``shared/datasets`` beside the checkout (may be missing)."""
    if copied is not None and (THIRD_PARTY / copied).exists():
        return THIRD_PARTY / copied
    return SHARED_DATASETS / shared
