"""JSON Schemas of every input and output record, generated from the msgspec types.

``python -m trainguard.dataflows.schemas [DIR]`` writes one schema per record into
``docs/schemas/`` and records each contract version's fingerprint in ``versions.json``. A
version's fingerprint never changes: when an output record changes shape and
``SCHEMA_VERSION`` (``trainguard.detectors.events``) was not bumped, generation refuses, and
``tests/unit/dataflows/test_contract.py`` fails, so a consumer never meets a new shape under an old number.

>>> sorted(RECORDS)
['action', 'anomaly', 'dead_letter', 'gpu', 'gpu_sweep', 'logs', 'progress', 'scheduler', 'stacks']
>>> schema("anomaly")["$defs"]["Anomaly"]["properties"]["schema_version"]["default"] == SCHEMA_VERSION
True
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from trainguard.actions.records import Action
from trainguard.detectors.events import (
    SCHEMA_VERSION,
    Anomaly,
    DeadLetter,
    GpuSample,
    GpuSweep,
    JobEvent,
    LogRecord,
    NodeEvent,
    ProgressRecord,
    StacksRecord,
)

__all__ = ["RECORDS", "ContractChanged", "fingerprint", "schema", "write"]

DOCS_DIR = Path(__file__).resolve().parent.parent / "docs" / "schemas"

# Inputs (one per topic) and outputs; the scheduler topic carries job and node records.
RECORDS: dict[str, Any] = {
    "logs": LogRecord,
    "progress": ProgressRecord,
    "gpu": GpuSample,
    "gpu_sweep": GpuSweep,  # the gpu topic's other form: a node's GPUs in one record
    "scheduler": JobEvent | NodeEvent,
    "stacks": StacksRecord,
    "anomaly": Anomaly,
    "action": Action,
    "dead_letter": DeadLetter,
}
OUTPUTS = ("anomaly", "action", "dead_letter")


class ContractChanged(RuntimeError):
    """An output record changed while SCHEMA_VERSION stayed the same."""


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema of one record, titled and versioned."""
    generated = msgspec.json.schema(RECORDS[name])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"trainguard {name} record",
        **generated,
    }


def _text(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def fingerprint() -> str:
    """One hash over the output records' schemas (what a consumer depends on)."""
    return hashlib.sha256("".join(_text(schema(name)) for name in OUTPUTS).encode()).hexdigest()


def expected_files(versions: dict[str, str]) -> dict[str, str]:
    """File name → text, for every record and the versions file (``versions``: what is recorded so far)."""
    current = fingerprint()
    recorded = versions.get(str(SCHEMA_VERSION))
    if recorded is not None and recorded != current:
        raise ContractChanged(
            f"the output records changed but SCHEMA_VERSION is still {SCHEMA_VERSION}: bump it in "
            "trainguard/detectors/events.py, then regenerate with python -m trainguard.dataflows.schemas"
        )
    files = {f"{name}.json": _text(schema(name)) for name in RECORDS}
    files["versions.json"] = _text({**versions, str(SCHEMA_VERSION): current})
    return files


def read_versions(directory: Path) -> dict[str, str]:
    path = directory / "versions.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def write(directory: Path = DOCS_DIR) -> list[Path]:
    """Write the schemas (and the current version's fingerprint) into ``directory``."""
    files = expected_files(read_versions(directory))
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return [directory / name for name in files]


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS_DIR
    try:
        written = write(target)
    except ContractChanged as exc:
        sys.exit(f"error: {exc}.")
    print(f"wrote {len(written)} files to {target} (schema version {SCHEMA_VERSION})")
