"""Running ``walflow check`` / ``walflow status`` as users do, in both output modes, and editing configs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import yaml

from tests.backfill.helpers import walflow


@dataclass(frozen=True)
class Outcome:
    """One command run twice, as text and as ``--json``: the same exit status both times."""

    code: int
    text: str
    data: dict[str, Any]

    @property
    def findings(self) -> list[dict[str, Any]]:
        return list(self.data.get("findings") or self.data.get("checks") or [])

    def finding(self, level: str, fragment: str) -> dict[str, Any]:
        """The finding at ``level`` whose text holds ``fragment``; on the screen too, with its fix (the text
        run came first, so ages and figures may differ from the JSON's: ``fragment`` is what must match)."""
        found = [f for f in self.findings if f["level"] == level and fragment in f["text"]]
        assert found, f"no {level} finding with {fragment!r} in:\n{json.dumps(self.findings, indent=1)}"
        assert fragment in self.text, self.text
        if found[0]["fix"]:
            assert f"fix: {found[0]['fix']}" in self.text, self.text
        return found[0]

    def levels(self, level: str) -> list[str]:
        return [f["text"] for f in self.findings if f["level"] == level]


def run_both(command: str, config: Path, *args: str, env: dict[str, str] | None = None) -> Outcome:
    """``walflow COMMAND CONFIG ARGS`` and the same with ``--json``: no traceback, nothing on stderr."""
    text = walflow(command, config, *args, env=env, timeout=90)
    machine = walflow(command, config, *args, "--json", env=env, timeout=90)
    for done in (text, machine):
        assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
        assert done.stderr == "", done.stderr
    assert text.returncode == machine.returncode, (text.stdout, machine.stdout)
    return Outcome(text.returncode, text.stdout, json.loads(machine.stdout))


def verdict(config: Path) -> str:
    """One quick ``walflow status --json`` (one sample): its verdict, for waiting on a state."""
    return str(json.loads(walflow("status", config, "--sample", "0", "--json", timeout=90).stdout)["verdict"])


def status(config: Path, *args: str, env: dict[str, str] | None = None) -> Outcome:
    """``walflow status`` with a short sample (1 s), both modes."""
    return run_both("status", config, "--sample", "1", *args, env=env)


def edit(config: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """Apply ``change`` to the parsed config file and write it back."""
    data = yaml.safe_load(config.read_text())
    change(data)
    config.write_text(yaml.safe_dump(data))
    return config


def health_on(config: Path, port: int) -> Path:
    """Turn the health endpoint on, at ``port``."""
    return edit(config, lambda data: data["walflow"].update(health={"enabled": True, "port": port}))


def add_stream(url: str, name: str, subjects: list[str]) -> None:
    async def run() -> None:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            await nc.jetstream().add_stream(name=name, subjects=subjects)
        finally:
            await nc.close()

    asyncio.run(run())


def stream_exists(url: str, name: str) -> bool:
    async def run() -> bool:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            return any(info.config.name == name for info in await nc.jetstream().streams_info())
        finally:
            await nc.close()

    return asyncio.run(run())
