"""The nats-py internals walflow hooks (connectors/nats/natspy.py): still there, still working.

Fails loudly on a nats-py that renamed or reshaped one of them: first by name and
signature against the installed package, then by exercising the hooks on a real server.
"""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from packaging.requirements import Requirement

from connectors.nats import natspy
from connectors.nats.natspy import WalflowClient
from core.runtime import Runtime
from tests.connectors.nats.clients import nats_client
from tests.harness import Nats, TestNames

ROOT = Path(__file__).resolve().parents[3]
runtime = Runtime()


def test_every_hooked_internal_exists_in_the_installed_nats_py() -> None:
    assert natspy.contract_problems() == [], f"nats-py {natspy.installed_version()} changed what walflow hooks"


def test_the_pin_is_pyprojects_and_the_installed_version_satisfies_it() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert natspy.PIN in dependencies
    assert Requirement(natspy.PIN).specifier.contains(natspy.installed_version())


def test_the_check_names_a_missing_attribute() -> None:
    class NoQueue(Client):
        def __init__(self) -> None:
            super().__init__()
            del self._pending

    assert natspy.contract_problems(NoQueue) == ["Client._pending (attribute)"]


def test_the_check_names_a_reshaped_method() -> None:
    class Reshaped(Client):
        async def _process_msg(self, sid: int, subject: bytes, reply: bytes, payload: bytes, hdr: bytes) -> None:
            pass

        async def _flush_pending(self, force_flush: bool) -> None:  # type: ignore[override]
            pass

    problems = natspy.contract_problems(Reshaped)
    assert problems == [
        "Client._flush_pending() (has (force_flush))",
        "Client._process_msg(sid, subject, reply, data, headers) (has (sid, subject, reply, payload, hdr))",
    ]


def test_the_check_names_a_reshaped_connect_command() -> None:
    """The CONNECT line walflow checks TLS before (WalflowClient._connect_command): a coroutine
    or a new parameter would bypass the check, so the contract names it."""

    class Reshaped(Client):
        async def _connect_command(self, verbose: bool) -> bytes:  # type: ignore[override]
            return b""

    assert natspy.contract_problems(Reshaped) == ["Client._connect_command() (plain method without arguments)"]


def test_the_check_names_a_renamed_subscription_id() -> None:
    class Renamed(Subscription):
        def __init__(self, conn: Any, id: int = 0, subject: str = "") -> None:
            super().__init__(conn, id, subject)
            self.sid = self.__dict__.pop("_id")

    assert natspy.contract_problems(subscription_cls=Renamed) == [
        "Subscription._id (attribute)", "Subscription._id (the subscription id)"
    ]


def test_a_changed_nats_py_fails_at_import_with_the_version_and_the_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(Client, "_flush_pending")
    with pytest.raises(ImportError) as info:
        natspy.check()
    message = str(info.value)
    assert "Client._flush_pending() (coroutine method)" in message
    assert f"nats-py {natspy.installed_version()} is installed" in message
    assert natspy.PIN in message


@pytest.fixture
def nc(nats_srv: Nats) -> Iterator[WalflowClient]:
    with nats_client(runtime, nats_srv, "walflow-contract") as client:
        yield client


def test_send_raw_and_subscribe_direct_on_a_real_server(nc: WalflowClient, names: TestNames) -> None:
    subject = f"{names.subject_prefix}.contract"

    async def exercise() -> tuple[list[tuple[bytes, bytes, bytes | None]], bytes]:
        got: list[tuple[bytes, bytes, bytes | None]] = []
        done = asyncio.Event()

        def handler(subj: bytes, data: bytes, headers: bytes | None) -> None:
            got.append((subj, data, headers))
            if len(got) == 2:
                done.set()

        sid = await nc.subscribe_direct(f"{subject}.direct", handler)
        plain = await nc.subscribe(f"{subject}.plain")  # not direct: nats-py's own path still works
        commands = (
            b"PUB %s.direct 5\r\nhello\r\n" % subject.encode()
            + b"HPUB %s.direct _INBOX.unused 31 36\r\nNATS/1.0\r\nNats-Msg-Id: id-1\r\n\r\nworld\r\n" % subject.encode()
            + b"PUB %s.plain 5\r\nplain\r\n" % subject.encode()
        )
        assert await nc.send_raw(commands)
        await asyncio.wait_for(done.wait(), 10)
        plain_msg = await plain.next_msg(timeout=10)
        await nc.unsubscribe_direct(sid)
        await plain.unsubscribe()
        return got, plain_msg.data

    got, plain = runtime.run(exercise())
    direct = f"{subject}.direct".encode()
    assert got[0] == (direct, b"hello", None)
    assert got[1][:2] == (direct, b"world")
    assert got[1][2] is not None and b"Nats-Msg-Id: id-1" in got[1][2]
    assert plain == b"plain"


def test_drop_pending_empties_nats_pys_queue_and_send_raw_refuses_while_disconnected(nc: WalflowClient) -> None:
    async def exercise() -> tuple[int, int, bool]:
        before = nc.pending_data_size + 6
        nc._pending.append(b"PING\r\n")  # as if queued and not yet flushed
        nc._pending_data_size += 6
        assert nc.pending_data_size == before
        nc.drop_pending()
        after = nc.pending_data_size
        await nc.close()
        return before, after, await nc.send_raw(b"PING\r\n")

    before, after, sent = runtime.run(exercise())
    assert before >= 6
    assert (after, sent) == (0, False)
