"""Pieces every ``trainguard`` command shares: consoles, option types, one-sentence errors."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from trainguard.dataflows.config import ConfigError, Settings, load_settings
from trainguard.datasets import records as simulated_records

# Wide enough for the score tables when output goes to a file or a CI log (Rich assumes 80 there).
console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True, highlight=False)

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", envvar="TRAINGUARD_CONFIG", help="YAML settings file.")
]
WorkersOpt = Annotated[int, typer.Option("--workers", "-w", min=1, max=64, help="Bytewax worker threads.")]
ProcessesOpt = Annotated[
    int,
    typer.Option(
        "--processes",
        "-p",
        min=1,
        max=64,
        help="Worker processes, each replaying its own shard of the jobs (uses that many cores).",
    ),
]
BrokersOpt = Annotated[
    str, typer.Option(envvar="TRAINGUARD_BROKERS", help="Comma-separated Kafka bootstrap servers, host:port.")
]


def fail(message: str) -> typer.Exit:
    """Print one sentence on stderr; raise the returned exit (status 2)."""
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    return typer.Exit(2)


# The bundled scenario (package data of trainguard.datasets).
DEMO_DIR = Path(simulated_records.__file__).resolve().parent / "samples" / "demo"  # the same in a checkout and a wheel


def writable_dir(path: Path, option: str = "--out") -> Path:
    """``path``, created if needed; one sentence when it cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".trainguard-write-check"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise fail(f"cannot write to {path} ({exc.strerror or exc}); pass {option} a writable directory.") from None
    return path


def settings_from(config: Path | None) -> Settings:
    try:
        return load_settings(config)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def brokers_list(brokers: str) -> list[str]:
    return [b.strip() for b in brokers.split(",") if b.strip()]


def kafka_settings(config: Path | None, brokers: str) -> Settings:
    """Settings with ``--brokers`` applied; one sentence when no broker is known at all."""
    settings = settings_from(config)
    if brokers:
        settings.kafka.brokers = brokers_list(brokers)
    if not settings.kafka.brokers:
        raise fail("no Kafka brokers given; pass --brokers HOST:PORT or set TRAINGUARD_BROKERS.")
    _require_reachable(settings)
    return settings


def _require_reachable(settings: Settings, timeout_s: float = 5.0) -> None:
    """One line when the brokers cannot be reached, before any producer starts."""
    from trainguard.dataflows.kafka_io import broker_topics

    try:
        broker_topics(settings.kafka, timeout_s)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def publishing_settings(config: Path | None, brokers: str, out: Path | None) -> Settings:
    """Settings for a producer command: it needs brokers, unless it writes to ``--out``."""
    settings = settings_from(config)
    if brokers:
        settings.kafka.brokers = brokers_list(brokers)
    if out is None and not settings.kafka.brokers:
        raise fail("give --brokers HOST:PORT (or TRAINGUARD_BROKERS) to publish, or --out FILE to write JSON Lines.")
    if out is None:
        _require_reachable(settings)
    return settings


def parse_time(text: str, option: str) -> float:
    """ISO-8601 (UTC when no zone is given) or epoch seconds → epoch seconds; one sentence when neither."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise fail(f"{option} {text!r} is neither ISO-8601 (2024-07-31T23:14:18Z) nor epoch seconds.") from None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()
