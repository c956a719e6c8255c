"""The output contract: versioned, with a JSON Schema per record kept in docs/schemas/ and checked here."""

from __future__ import annotations

import msgspec
import pytest

from trainguard.actions.records import Action
from trainguard.dataflows.schemas import DOCS_DIR, RECORDS, ContractChanged, expected_files, read_versions
from trainguard.detectors.events import SCHEMA_VERSION, Anomaly


def test_the_committed_schemas_are_what_the_code_generates() -> None:
    expected = expected_files(read_versions(DOCS_DIR))
    for name, text in expected.items():
        path = DOCS_DIR / name
        assert path.is_file() and path.read_text() == text, (
            f"docs/schemas/{name} is stale: run python -m trainguard.dataflows.schemas"
        )
    assert {p.name for p in DOCS_DIR.glob("*.json")} == set(expected)
    assert set(expected) == {f"{name}.json" for name in RECORDS} | {"versions.json"}


def test_an_output_change_without_a_version_bump_is_refused() -> None:
    versions = read_versions(DOCS_DIR)
    assert str(SCHEMA_VERSION) in versions
    with pytest.raises(ContractChanged, match="bump it"):
        expected_files({**versions, str(SCHEMA_VERSION): "the fingerprint of a different contract"})
    # Older versions' fingerprints stay as they were recorded.
    assert expected_files(versions)["versions.json"].count('"') == 4 * len(versions)


def test_every_record_the_demo_produces_fits_the_contract(demo_result) -> None:
    for anomaly in [*demo_result.anomalies, *demo_result.resolutions]:
        back = msgspec.json.decode(msgspec.json.encode(anomaly), type=Anomaly)  # enumerations checked
        assert back.schema_version == SCHEMA_VERSION and back.summary and back.runbook_url
    for action in demo_result.actions:
        assert msgspec.json.decode(msgspec.json.encode(action), type=Action).schema_version == SCHEMA_VERSION
    with pytest.raises(msgspec.ValidationError, match="kind"):
        msgspec.json.decode(
            msgspec.json.encode({**msgspec.to_builtins(demo_result.anomalies[0]), "kind": "oops"}), type=Anomaly
        )
