"""Settings for a run: YAML file, then environment variables and flags on top.

Every field has a default, so an empty file (or none) is a valid config. Unknown
keys and wrong types are refused with one sentence naming the key.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from trainguard.actions.drivers import SchedulerSettings
from trainguard.actions.notify import NotifySettings
from trainguard.actions.policy import PolicyConfig
from trainguard.detectors.events import TOPICS
from trainguard.detectors.protocol import check_plugin
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
    notify: NotifySettings = msgspec.field(default_factory=NotifySettings)
    audit_log: str | None = None
    silences: str | None = None  # the silences file (default: silences.jsonl beside the audit log)

    @property
    def silences_path(self) -> Path | None:
        if self.silences:
            return Path(self.silences)
        return Path(self.audit_log).with_name("silences.jsonl") if self.audit_log else None


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
        raise ConfigError(f"config file {p}: {explain_invalid(exc, data)}.") from None
    except (UnicodeError, TypeError, ValueError):  # e.g. a lone surrogate escape in a key
        raise ConfigError(
            f"config file {p} holds text that is not valid Unicode; fix the escaped characters."
        ) from None
    for stream in settings.kafka.topics:
        if stream not in TOPICS:
            raise ConfigError(
                f"config file {p}: kafka.topics has unknown stream {stream!r}; use one of {', '.join(TOPICS)}."
            )
    for spec in settings.detectors.plugins:
        try:
            check_plugin(spec, settings.detectors)
        except ValueError as exc:
            raise ConfigError(f"config file {p}: detectors.plugins: {exc}".rstrip(".") + ".") from None
    return settings


_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_TOKEN = re.compile(r"\.(\w+)|\[(\d+)\]")
_KINDS = {
    "float": "a number",
    "int": "a whole number",
    "str": "text",
    "bool": "true or false",
    "array": "a list",
    "object": "a mapping of settings",
}
_BOUND = re.compile(r"^Expected `\w+` (?P<op>[<>]=?) (?P<limit>[-\d.e]+)$")


def explain_invalid(exc: msgspec.ValidationError, data: Any, root: type = Settings) -> str:
    """msgspec's validation error as a sentence about the setting: the allowed values, the
    nearest key for a typo, the range a number must be in.

    >>> def why(data):
    ...     try:
    ...         msgspec.convert(data, Settings)
    ...     except msgspec.ValidationError as exc:
    ...         return explain_invalid(exc, data)
    >>> why({"policy": {"mode": "enforcing"}})
    "policy.mode must be one of enforce, monitor (not 'enforcing')"
    >>> why({"detectors": {"hang": {"flor_s": 5}}})
    'detectors.hang has no setting flor_s; did you mean floor_s?'
    >>> why({"detectors": {"straggler": {"ratio": 0.5}}})
    'detectors.straggler.ratio must be > 1 (not 0.5)'
    """
    m = _AT.match(str(exc))
    what, path = (m["what"], m["path"] or "") if m else (str(exc), "")
    steps: list[str | int] = [int(i) if i else name for name, i in _TOKEN.findall(path)]
    key = ".".join(str(s) if isinstance(s, str) else f"[{s}]" for s in steps).replace(".[", "[") or "the file"
    value = _value_at(data, steps)
    if what.startswith("Invalid enum value"):
        allowed = _literal_values(_type_at(root, steps))
        if allowed:
            return f"{key} must be one of {', '.join(map(str, allowed))} (not {value!r})"
    unknown = re.match(r"Object contains unknown field `(.*)`", what)
    if unknown:
        fields = _field_names(_type_at(root, steps))
        close = difflib.get_close_matches(unknown[1], fields, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; the settings there are {', '.join(fields)}"
        return f"{key} has no setting {unknown[1]}{hint}"
    expected = re.match(r"Expected `(\w+)`(?:, got `\w+`)?$", what)
    if expected and expected[1] in _KINDS:
        return f"{key} must be {_KINDS[expected[1]]} (not {value!r})"
    bound = _BOUND.match(what)
    if bound:
        limit = float(bound["limit"])
        return f"{key} must be {bound['op']} {limit:g} (not {value!r})"
    return f"{key}: {what}"


def _value_at(data: Any, steps: list[str | int]) -> Any:
    for step in steps:
        try:
            data = data[step]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _type_at(root: type, steps: list[str | int]) -> msgspec.inspect.Type:
    info: msgspec.inspect.Type = msgspec.inspect.type_info(root)
    for step in steps:
        info = _unwrap(info)
        if isinstance(step, int) and isinstance(info, msgspec.inspect.ListType):
            info = info.item_type
        elif isinstance(step, str) and isinstance(info, msgspec.inspect.StructType):
            info = next((f.type for f in info.fields if f.encode_name == step), info)
        elif isinstance(step, str) and isinstance(info, msgspec.inspect.DictType):
            info = info.value_type
    return _unwrap(info)


def _unwrap(info: msgspec.inspect.Type) -> msgspec.inspect.Type:
    if isinstance(info, msgspec.inspect.UnionType):  # Optional[X]: X
        kept = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
        return kept[0] if len(kept) == 1 else info
    return info


def _literal_values(info: msgspec.inspect.Type) -> tuple[Any, ...]:
    return info.values if isinstance(info, msgspec.inspect.LiteralType) else ()


def _field_names(info: msgspec.inspect.Type) -> list[str]:
    return [f.encode_name for f in info.fields] if isinstance(info, msgspec.inspect.StructType) else []
