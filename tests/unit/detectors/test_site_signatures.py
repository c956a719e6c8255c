"""A site's own signatures: read from the config, tried before the catalogue, through the real flow."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.dataflows.config import ConfigError, load_settings
from trainguard.dataflows.pipeline import replay_in_process
from trainguard.detectors.signatures import match_line, use_site_signatures

SITE = """
detectors:
  signatures:
    - id: fabric-port-flap
      pattern: 'fabricmanager\\[\\d+\\]: port (?P<port>\\d+) on switch \\S+ flapped'
      category: ib_link
      layer: hardware
      transient: true
    - id: nccl-timeout-is-ours
      pattern: 'Watchdog caught collective operation timeout'
      category: nccl_timeout
      layer: application
    - id: quota-warning
      pattern: 'scratch quota above 95%'
      category: scratch_quota
      layer: system
      kind: node_unhealthy
      notice: true
"""


@pytest.fixture(autouse=True)
def _no_site_signatures_left_behind() -> Iterator[None]:
    yield
    use_site_signatures([])


def _replay(tmp_path: Path, lines: list[str], config: Path | None) -> list:
    replay = tmp_path / "replay"
    replay.mkdir(parents=True)
    records = [
        {"ts": 1_800_000_000.0 + i, "job_id": "j1", "node": "gpu-07", "source": "app", "line": line}
        for i, line in enumerate(lines)
    ]
    (replay / "logs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return replay_in_process(replay, load_settings(config) if config else None).anomalies


def test_a_site_signature_reads_a_wording_the_catalogue_does_not_know(tmp_path: Path) -> None:
    config = tmp_path / "site.yaml"
    config.write_text(SITE)
    line = "fabricmanager[811]: port 17 on switch sw-3 flapped"
    assert _replay(tmp_path / "bare", [line], None) == []
    (found,) = _replay(tmp_path / "site", [line], config)
    assert (found.kind, found.category, found.layer, found.transient) == ("crash", "ib_link", "hardware", True)
    assert any("port 17" in e for e in found.evidence)


def test_a_site_signature_outranks_the_catalogue_and_a_notice_never_acts(tmp_path: Path) -> None:
    use_site_signatures(load_settings(_write(tmp_path, SITE)).detectors.signatures)
    timeout = match_line("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE)")
    assert timeout is not None
    assert (timeout.signature.id, timeout.signature.layer) == ("site:nccl-timeout-is-ours", "application")
    quota = match_line("scratch quota above 95% on /lustre")
    assert quota is not None and quota.signature.notice and quota.signature.kind == "node_unhealthy"
    use_site_signatures([])
    assert match_line("[Rank 3] Watchdog caught collective operation timeout: x").signature.layer == "system"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("{id: x, pattern: 'port (', category: ib_link, layer: hardware}", "pattern does not compile"),
        ("{id: x, pattern: 'p', category: ib_link, layer: firmware}", "layer"),
        ("{id: x, pattern: 'p', category: ib_link, layer: hardware, remedy: REBOOT}", "remedy 'REBOOT'"),
        ("{id: 'has space', pattern: 'p', category: ib_link, layer: hardware}", "id"),
        ("{id: x, pattern: 'p', layer: hardware}", "category"),
        ("{id: x, pattern: 'Port Flap', category: IB-link, layer: hardware}", "lower-case letters"),
        ("{id: x, pattern: '(oops)?', category: ib_link, layer: hardware}", "matches an empty line"),
        (
            "{id: x, pattern: 'a', category: c, layer: system}, {id: x, pattern: 'b', category: c, layer: system}",
            "given twice",
        ),
    ],
)
def test_a_wrong_site_signature_is_one_sentence_naming_what_to_fix(tmp_path: Path, entry: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, f"detectors:\n  signatures: [{entry}]\n"))
    message = str(err.value)
    assert says in message and "signatures" in message
    assert message.count("\n") == 0


def _actions(tmp_path: Path, lines: list[str], config: Path) -> tuple[list, list]:
    replay = tmp_path / "replay"
    replay.mkdir(parents=True)
    records = [
        {"ts": 1_800_000_000.0 + 10 * i, "job_id": "j1", "node": "gpu-07", "source": "app", "line": line}
        for i, line in enumerate(lines)
    ]
    (replay / "logs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = replay_in_process(replay, load_settings(config))
    return out.anomalies, out.actions


def test_a_site_notice_is_reported_and_never_acted_on(tmp_path: Path) -> None:
    config = _write(tmp_path, SITE)
    found, actions = _actions(tmp_path / "notice", ["step 1 loss 2.0", "scratch quota above 95% on /lustre"], config)
    assert [(a.kind, a.category, a.severity) for a in found] == [("node_unhealthy", "scratch_quota", "warning")]
    assert [x.action for x in actions] == ["notify"]
    found, actions = _actions(tmp_path / "crash", ["fabricmanager[811]: port 17 on switch sw-3 flapped"], config)
    assert [a.category for a in found] == ["ib_link"]
    assert {"drain_node", "requeue_job"} & {x.action for x in actions}  # a critical one of the same site: acted on


def test_a_site_storm_needs_its_count_of_lines(tmp_path: Path) -> None:
    config = _write(
        tmp_path,
        "detectors:\n  signatures:\n"
        "    - {id: retry, pattern: 'object store retry \\d+', category: storage_retry, layer: system, storm: 3}\n",
    )
    two, _ = _actions(tmp_path / "two", ["object store retry 1", "object store retry 2"], config)
    assert two == []
    three, _ = _actions(tmp_path / "three", [f"object store retry {i}" for i in range(3)], config)
    assert [(a.category, a.layer) for a in three] == [("storage_retry", "system")]
