"""Settings for a run: YAML file, then environment variables and flags on top.

Every field has a default, so an empty file (or none) is a valid config. Unknown
keys and wrong types are refused with one sentence naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec
import yaml

from trainguard.actions.policy import PolicyConfig
from trainguard.detectors.events import TOPICS
from trainguard.detectors.routing import RouterSettings
from trainguard.detectors.settings import DetectorSettings


class ConfigError(ValueError):
    """A bad setting; the message is one sentence that says what to fix.

    >>> print(ConfigError("unknown field `" + chr(10) + "`"))
    unknown field `\\n`
    """

    def __init__(self, message: str) -> None:
        # Keys come from the file: a control character in one must not break the sentence.
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in message))


class KafkaSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    brokers: list[str] = []
    # Logical stream -> Kafka topic name; missing streams use their own name.
    topics: dict[str, str] = {}
    anomalies_topic: str = "anomalies"
    actions_topic: str = "actions"
    dead_letter_topic: str = "dead_letter"
    starting_offset: Literal["beginning", "end"] = "beginning"
    batch_size: int = 1000
    extra: dict[str, str] = {}

    def topic_for(self, stream: str) -> str:
        return self.topics.get(stream, stream)


class ArchiveSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: str | None = None
    roll_rows: int = 50_000
    roll_s: float = 10.0


class SchedulerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Which scheduler the action sink may act on, and how its commands are run."""

    driver: Literal["none", "dry-run", "slurm", "kubernetes"] = "none"
    ssh_host: str | None = None  # run the Slurm tools on this host (ssh -o BatchMode=yes)
    bin_dir: str | None = None  # where the Slurm tools are (default: PATH)
    timeout_s: float = 30.0
    attempts: int = 3
    backoff_s: float = 1.0
    namespace: str = "default"  # Kubernetes
    kube_context: str | None = None


class ConsoleUser(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A console user: a bearer token (its SHA-256, hex) and/or a password for basic auth.

    ``password_scrypt`` (from ``trainguard hash-password``) is the way to store a
    password; ``password_sha256`` is still read, for configs written before it.
    """

    name: str
    role: Literal["viewer", "operator"] = "viewer"
    token_sha256: str | None = None
    password_scrypt: str | None = None
    password_sha256: str | None = None


class ConsoleSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 8765
    users: list[ConsoleUser] = []


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    detectors: DetectorSettings = msgspec.field(default_factory=DetectorSettings)
    router: RouterSettings = msgspec.field(default_factory=RouterSettings)
    kafka: KafkaSettings = msgspec.field(default_factory=KafkaSettings)
    archive: ArchiveSettings = msgspec.field(default_factory=ArchiveSettings)
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    scheduler: SchedulerSettings = msgspec.field(default_factory=SchedulerSettings)
    console: ConsoleSettings = msgspec.field(default_factory=ConsoleSettings)
    audit_log: str | None = None


def load_settings(path: str | Path | None) -> Settings:
    """Settings from a YAML file (``None``: all defaults)."""
    if path is None:
        return Settings()
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist; pass an existing YAML file to --config.")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML ({str(exc).splitlines()[0]}).") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not UTF-8 text; save it as UTF-8.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of settings, not a {type(data).__name__}.")
    try:
        settings = msgspec.convert(data, Settings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"config file {p}: {exc}.") from None
    except (UnicodeError, TypeError, ValueError):  # e.g. a lone surrogate escape in a key
        raise ConfigError(
            f"config file {p} holds text that is not valid Unicode; fix the escaped characters."
        ) from None
    for stream in settings.kafka.topics:
        if stream not in TOPICS:
            raise ConfigError(
                f"config file {p}: kafka.topics has unknown stream {stream!r}; use one of {', '.join(TOPICS)}."
            )
    return settings
