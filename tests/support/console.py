"""Console test helpers: users, the demo's inventory, basic auth."""

from __future__ import annotations

import base64
from pathlib import Path

import msgspec

from trainguard.actions.drivers import Inventory, JobInfo, NodeInfo
from trainguard.console.app import sha256_hex
from trainguard.console.passwords import hash_password
from trainguard.dataflows.config import Settings

ALICE_SCRYPT = hash_password("alice-pw", n=2**10)  # cheap cost for the tests; the default is 2**14


def console_settings(audit: Path) -> Settings:
    return msgspec.convert(
        {
            "audit_log": str(audit),
            "console": {
                "users": [
                    {"name": "alice", "role": "operator", "password_scrypt": ALICE_SCRYPT},
                    {"name": "victor", "role": "viewer", "password_sha256": sha256_hex("victor-pw")},  # older configs
                    {"name": "robot", "role": "viewer", "token_sha256": sha256_hex("s3cret-token")},
                ]
            },
        },
        Settings,
    )


def demo_inventory() -> Inventory:
    nodes = {f"gpu-node-{i:02d}": NodeInfo(f"gpu-node-{i:02d}", "mixed", ("gpu",)) for i in range(1, 13)}
    jobs = {j: JobInfo(j, f"job-{j}", "RUNNING", "gpu") for j in ("1001", "1002", "1003", "1004", "1005")}
    return Inventory(nodes=nodes, jobs=jobs)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
