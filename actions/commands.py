"""Running scheduler commands: argv lists only, a timeout, retries with backoff, every attempt recorded.

Nothing here ever goes through a shell. Over SSH, the remote side *does* run a
shell, so each argument is quoted for it (and ``BatchMode``/host-key checking keep
ssh from prompting or trusting a stranger).

>>> runner = CommandRunner(timeout_s=5, attempts=2, backoff_s=0.0)
>>> runner.run(["echo", "gpu-node-01; rm -rf /"]).stdout
'gpu-node-01; rm -rf /\\n'
>>> [a.ok for a in runner.last_attempts]
[True]
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Attempt:
    """One try of one command: what ran, how it ended, how long it took."""

    argv: tuple[str, ...]
    ok: bool
    returncode: int | None
    detail: str
    duration_s: float

    def as_dict(self) -> dict[str, object]:
        return {
            "argv": list(self.argv),
            "ok": self.ok,
            "returncode": self.returncode,
            "detail": self.detail,
            "duration_s": round(self.duration_s, 4),
        }


@dataclass(frozen=True)
class Completed:
    stdout: str
    attempts: tuple[Attempt, ...]


class CommandFailed(RuntimeError):
    """A command failed on every attempt; ``attempts`` says how each one ended."""

    def __init__(self, message: str, attempts: Sequence[Attempt]) -> None:
        super().__init__(message)
        self.attempts = tuple(attempts)


@dataclass
class CommandRunner:
    """Runs argv lists with a timeout and retries (``attempts`` tries, backoff doubling from ``backoff_s``)."""

    timeout_s: float = 30.0
    attempts: int = 3
    backoff_s: float = 1.0
    ssh_host: str | None = None
    bin_dir: str | None = None  # where the scheduler's tools live (default: PATH)
    env: Mapping[str, str] | None = None
    last_attempts: list[Attempt] = field(default_factory=list)

    def argv_for(self, argv: Sequence[str]) -> list[str]:
        if self.bin_dir is not None:
            argv = [f"{self.bin_dir.rstrip('/')}/{argv[0]}", *argv[1:]]
        if self.ssh_host is None:
            return list(argv)
        remote = " ".join(shlex.quote(a) for a in argv)
        return ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "--", self.ssh_host, remote]

    def run(self, argv: Sequence[str]) -> Completed:
        """Run until one attempt succeeds; raise :class:`CommandFailed` when all have failed."""
        full = self.argv_for(argv)
        tried: list[Attempt] = []
        delay = self.backoff_s
        for attempt in range(max(1, self.attempts)):
            if attempt:
                time.sleep(delay)
                delay *= 2
            started = time.monotonic()
            try:
                proc = subprocess.run(
                    full, capture_output=True, text=True, timeout=self.timeout_s, env=self._env(), check=False
                )
            except subprocess.TimeoutExpired:
                tried.append(Attempt(tuple(full), False, None, f"timed out after {self.timeout_s:g} s", since(started)))
                continue
            except OSError as exc:  # the binary is missing: retrying will not help
                tried.append(Attempt(tuple(full), False, None, f"cannot run {full[0]}: {exc.strerror}", since(started)))
                break
            detail = (proc.stderr or proc.stdout).strip()[-300:]
            tried.append(Attempt(tuple(full), proc.returncode == 0, proc.returncode, detail, since(started)))
            if proc.returncode == 0:
                self.last_attempts = tried
                return Completed(proc.stdout, tuple(tried))
        self.last_attempts = tried
        raise CommandFailed(f"{' '.join(argv[:3])} failed after {len(tried)} attempt(s): {tried[-1].detail}", tried)

    def _env(self) -> dict[str, str] | None:
        if self.env is None:
            return None
        import os

        return {**os.environ, **self.env}


def since(started: float) -> float:
    """Seconds on the monotonic clock since ``started``."""
    return time.monotonic() - started
