"""NATS-side fatal errors, through the real pipeline: exit status 2 and one line saying what to do.

Each case starts ``python -m bytewax.run dataflows.cdc`` as users do and waits for it to
exit (with a deadline): a wrong password, a user without permission on JetStream's API,
and a stream that exists with other subjects.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from embedded import NatsServer
from tests.harness import Database, Nats, TestNames
from tests.pipeline import fatal_line, run_to_exit, write_config

PASSWORD = "right-pw"
AUTH = (
    "authorization {\n"
    "  users = [\n"
    f"    {{user: walflow, password: {json.dumps(PASSWORD)}}}\n"
    f"    {{user: nojs, password: {json.dumps(PASSWORD)}, permissions: {{publish: {{deny: [\"$JS.API.>\"]}}}}}}\n"
    "  ]\n"
    "}"
)


@pytest.fixture(scope="module")
def auth_nats() -> Iterator[NatsServer]:
    with NatsServer(extra_config=AUTH) as server:
        yield server


@pytest.mark.slow
def test_a_wrong_nats_password_stops_with_one_line(
    tmp_path: Path, database: Database, auth_nats: NatsServer, names: TestNames
) -> None:
    sink = {"name": "events", "destination": {"username": "walflow", "password": "wrong-pw",
                                              "subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    line = fatal_line(run_to_exit(write_config(tmp_path, database, auth_nats, names, [sink], log_level="warning")))
    assert line.startswith(f"walflow: NATS at {auth_nats.address} refused the credentials"), line
    assert "Authorization Violation" in line
    assert "check destination.username ('walflow') and password" in line
    assert "wrong-pw" not in line  # never the secret itself


@pytest.mark.slow  # the refused request times out first (5 s)
def test_a_user_without_permission_on_the_jetstream_api_stops_with_one_line(
    tmp_path: Path, database: Database, auth_nats: NatsServer, names: TestNames
) -> None:
    sink = {"name": "events", "destination": {"username": "nojs", "password": PASSWORD,
                                              "subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    line = fatal_line(run_to_exit(write_config(tmp_path, database, auth_nats, names, [sink], log_level="warning")))
    assert line.startswith(f"walflow: NATS at {auth_nats.address} refused a JetStream API request of sink 'events' ("), line
    assert 'permissions violation for publish to "$js.api.stream.info.' in line.lower()  # what nats-py reported
    assert "grant user 'nojs' that subject: docs/nats-permissions.conf lists each one walflow uses" in line


@pytest.mark.slow
def test_a_stream_with_other_subjects_stops_with_one_line(
    tmp_path: Path, database: Database, nats_srv: Nats, names: TestNames, stream_cleanup: str
) -> None:
    async def create() -> None:
        nc = await nats.connect(nats_srv.url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            await nc.jetstream().add_stream(name=names.stream, subjects=[f"{names.subject_prefix}.other.>"])
        finally:
            await nc.close()

    asyncio.run(create())
    sink = {"name": "events", "destination": {"subject_prefix": names.subject_prefix, "stream": {"name": names.stream}}}
    line = fatal_line(run_to_exit(write_config(tmp_path, database, nats_srv, names, [sink], log_level="warning")))
    assert line.startswith(
        f"walflow: JetStream stream '{names.stream}' captures ['{names.subject_prefix}.other.>'], not walflow's "
        f"subjects '{names.subject_prefix}.shop.>' for database 'shop'"
    ), line
