"""What ``walflow check`` says of a sink's durability past the broker: how many copies its
stream keeps, and whether ``confirm_delay_ms`` covers what its servers may lose.

JetStream acknowledges a message before it syncs it to disk: every ``sync_interval`` (2
minutes by default), or at each write with ``sync_interval: always``. A server that crashes
loses what it had not synced; one replica loses it for good, three lose it only when a
majority goes down together (Jepsen found such cases too). walflow keeps the slot
``confirm_delay_ms`` behind the acknowledgements, so it can publish again whatever was lost
within that delay (README, "Guarantees"). The servers tell their sync policy only on their
monitoring port (``/varz``: ``jetstream.config.sync_interval`` in nanoseconds,
``sync_always``), read when ``destination.monitoring_urls`` lists them; otherwise the default
is assumed and said to be.
"""

from __future__ import annotations

import json
from typing import Any, Final

from cli.probe import NO_PROXY, Finding, Level, ProbeClient
from config.schema import SinkConfig
from core.display import display_url

#: JetStream's ``sync_interval`` when a server's config sets none (nats-server 2.10–2.15).
DEFAULT_SYNC_INTERVAL: Final = 120.0


def _secs(seconds: float) -> str:
    return f"{seconds:g} s"


def sync_policy(url: str) -> tuple[float | None, str | None]:
    """A server's sync interval in seconds from its ``/varz`` (0: every write is synced), or
    None and why it could not be read."""
    try:
        with NO_PROXY.open(f"{url.rstrip('/')}/varz", timeout=3) as reply:
            varz: dict[str, Any] = json.loads(reply.read())
    except (OSError, ValueError) as exc:
        return None, f"{display_url(url)}/varz did not answer ({getattr(exc, 'reason', exc)})"
    config = (varz.get("jetstream") or {}).get("config") or {}
    if not isinstance(config, dict) or not config:
        return None, f"{display_url(url)}/varz shows no JetStream config (is JetStream enabled there?)"
    if config.get("sync_always"):
        return 0.0, None
    return float(config.get("sync_interval") or DEFAULT_SYNC_INTERVAL * 1e9) / 1e9, None


async def durability_checks(nc: ProbeClient, sink: SinkConfig, stream: str | None) -> list[Finding]:
    """The stream's replicas and storage (the existing stream's, else what walflow would
    create), and the confirm delay against the servers' sync policy."""
    about, dest = f"sink {sink.name}", sink.destination
    if stream is not None:
        config = (await nc.jetstream().stream_info(stream)).config
        replicas, storage, named = config.num_replicas or 1, str(getattr(config.storage, "value", "file")), stream
    else:
        replicas, storage, named = dest.stream.replicas, dest.stream.storage, dest.stream.name
    findings: list[Finding] = []
    if storage == "memory":
        findings.append(Finding(about, Level.WARN, f"stream {named} keeps its messages in memory: a restart of its "
                                "servers loses them, and walflow can publish again only what confirm_delay_ms covers",
                                "use file storage (destination.stream.storage: file)"))
    if replicas < 3:
        findings.append(Finding(about, Level.WARN, f"stream {named} keeps {replicas} replica(s): one server's crash or "
                                "lost disk loses what it acknowledged; walflow publishes again only what "
                                "confirm_delay_ms covers", "on a 3-node cluster, set destination.stream.replicas: 3"))
    else:
        findings.append(Finding(about, Level.OK, f"stream {named} keeps {replicas} replicas"))
    return [*findings, _delay_check(sink)]


def _delay_check(sink: SinkConfig) -> Finding:
    about, dest = f"sink {sink.name}", sink.destination
    delay = dest.confirm_delay_ms / 1000
    urls = [str(url) for url in dest.monitoring_urls or []]
    if not urls:
        if delay < DEFAULT_SYNC_INTERVAL:
            return Finding(about, Level.WARN, f"confirm_delay_ms ({_secs(delay)}) is shorter than JetStream's "
                           f"default sync_interval ({_secs(DEFAULT_SYNC_INTERVAL)}): what a crashed server acknowledged "
                           "but had not synced may be past the slot", "set confirm_delay_ms to at least the servers' "
                           "sync_interval, or list their monitoring endpoints in destination.monitoring_urls to check it")
        return Finding(about, Level.INFO, f"confirm_delay_ms ({_secs(delay)}) covers JetStream's default "
                       f"sync_interval ({_secs(DEFAULT_SYNC_INTERVAL)}); list the servers in "
                       "destination.monitoring_urls to check their own")
    read = [(url, *sync_policy(url)) for url in urls]
    unread = [problem for _, interval, problem in read if interval is None and problem]
    if unread:
        return Finding(about, Level.WARN, f"could not read the sync policy: {'; '.join(unread)}",
                       "check destination.monitoring_urls (each server's http: port)")
    longest_url, longest = max(((url, interval or 0.0) for url, interval, _ in read), key=lambda pair: pair[1])
    if delay < longest:
        return Finding(about, Level.WARN, f"confirm_delay_ms ({_secs(delay)}) is shorter than {display_url(longest_url)}'s "
                       f"sync_interval ({_secs(longest)}): what a crashed server acknowledged but had not synced "
                       "may be past the slot", f"set confirm_delay_ms to at least {int(longest * 1000) + 10_000}")
    policy = "every write" if longest == 0 else f"every {_secs(longest)} at most"
    return Finding(about, Level.OK, f"the servers sync {policy}: confirm_delay_ms ({_secs(delay)}) covers it")
