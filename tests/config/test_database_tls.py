"""A database's TLS keys: libpq's own (``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``,
``sslpassword``), in the entry or in its ``url``, beside Sequin's ``ssl``. Keys that contradict
each other, or that libpq would ignore, are refused with the key and the fix: each would leave
the server less verified than the config reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import DatabaseConfig, parse_config
from tests.config.test_sequin_forms import database, errors_of


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    """A file where a PEM file is expected: the schema checks that it exists, libpq reads it."""
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def db_of(extra: str, *, where: str | None = None) -> DatabaseConfig:
    text = database(extra) if where is None else database(extra, where=where)
    return parse_config(text, env={}).databases[0]


@pytest.mark.parametrize(
    ("extra", "sslmode"),
    [
        ("", "prefer"),  # libpq's default
        ("    ssl: false\n", "prefer"),  # not disable: see DatabaseConfig.ssl
        ("    ssl: true\n", "require"),
        ("    sslmode: disable\n", "disable"),
        ("    sslmode: allow\n", "allow"),
        ("    sslmode: require\n", "require"),
        ("    sslmode: verify-ca\n", "verify-ca"),
        ("    sslmode: verify-full\n", "verify-full"),
        # both given, and agreeing
        ("    ssl: true\n    sslmode: verify-full\n", "verify-full"),
        ("    ssl: false\n    sslmode: disable\n", "disable"),
    ],
)
def test_the_sslmode_is_libpqs_and_ssl_is_sequins(extra: str, sslmode: str) -> None:
    assert db_of(extra).libpq_sslmode == sslmode


def test_the_certificate_keys_are_taken_and_the_key_passphrase_is_secret(pem: Path) -> None:
    db = db_of(f"    sslmode: verify-full\n    sslrootcert: {pem}\n    sslcert: {pem}\n    sslkey: {pem}\n"
               "    sslpassword: canary-passphrase\n")

    assert (db.sslrootcert, db.sslcert, db.sslkey) == (str(pem), str(pem), str(pem))
    assert db.sslpassword is not None and db.sslpassword.get_secret_value() == "canary-passphrase"
    assert "canary-passphrase" not in repr(db)


def test_the_systems_trusted_cas_are_libpqs_sslrootcert_system() -> None:
    assert db_of("    sslmode: verify-full\n    sslrootcert: system\n").sslrootcert == "system"


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("    ssl: true\n    sslmode: prefer\n",
         "databases[0].ssl: ssl: true and sslmode: prefer disagree (ssl: true is sslmode require or stronger, false "
         "prefer or weaker): remove ssl, sslmode says it all"),
        ("    ssl: false\n    sslmode: verify-full\n",
         "databases[0].ssl: ssl: false and sslmode: verify-full disagree (ssl: true is sslmode require or stronger, "
         "false prefer or weaker): remove ssl, sslmode says it all"),
        ("    sslrootcert: {pem}\n",
         "databases[0].sslrootcert: sslmode prefer never checks the server's certificate, so sslrootcert would be "
         "ignored: set sslmode: verify-full"),
        ("    sslmode: verify-ca\n    sslrootcert: system\n",
         "databases[0].sslrootcert: sslrootcert: system needs sslmode: verify-full (it is verify-ca), as libpq "
         "requires: any server with a public certificate would pass a weaker check"),
        ("    sslcert: {pem}\n",
         "databases[0].sslkey: a client certificate takes both sslcert (its PEM file) and sslkey (its private key's)"),
        ("    sslpassword: canary-passphrase\n",
         "databases[0].sslpassword: sslpassword decrypts sslkey: give sslcert and sslkey, or remove sslpassword"),
        ("    sslmode: verify_full\n",
         "databases[0].sslmode: Input should be 'disable', 'allow', 'prefer', 'require', 'verify-ca' or "
         "'verify-full' (got 'verify_full')"),
    ],
    ids=["ssl-true-prefer", "ssl-false-verify", "rootcert-unused", "system-weak", "cert-without-key",
         "password-without-key", "unknown-mode"],
)
def test_tls_keys_that_contradict_or_go_unused_are_refused(extra: str, problem: str, pem: Path) -> None:
    problems = errors_of(database(extra.format(pem=pem)))

    assert problems == [problem]
    assert "canary-passphrase" not in problems[0]


@pytest.mark.parametrize("key", ["sslrootcert", "sslcert", "sslkey"])
def test_a_tls_file_that_does_not_exist_is_an_error_naming_its_key(key: str, tmp_path: Path, pem: Path) -> None:
    files = {"sslrootcert": pem, "sslcert": pem, "sslkey": pem, key: tmp_path / "missing.pem"}
    lines = "".join(f"    {name}: {path}\n" for name, path in files.items())

    problems = errors_of(database(f"    sslmode: verify-full\n{lines}"))

    assert len(problems) == 1 and problems[0].startswith(f"databases[0].{key}: no file at {tmp_path / 'missing.pem'}: "
                                                         "give the PEM file of ")


def test_a_urls_tls_parameters_are_the_keys_of_their_names(pem: Path) -> None:
    url = f"postgres://walflow:pw@db.internal/app?sslmode=verify-full&sslrootcert={pem}&sslpassword=canary%20phrase"
    db = db_of(f"    sslcert: {pem}\n    sslkey: {pem}\n    url: '{url}'\n", where="")

    assert (db.hostname, db.libpq_sslmode, db.sslrootcert) == ("db.internal", "verify-full", str(pem))
    # the query is percent-decoded, as libpq reads it (the host and the password are not, as in Sequin)
    assert db.sslpassword is not None and db.sslpassword.get_secret_value() == "canary phrase"


@pytest.mark.parametrize(
    ("query", "extra", "problem"),
    [
        ("?sslrootcert={pem}&sslmode=verify-full", "    sslrootcert: {pem}\n",
         "give either sslrootcert or the URL's sslrootcert, not both"),
        ("?sslmode=verify-full", "    ssl: true\n", "give either ssl or the URL's sslmode, not both"),
        ("?sslmode=require", "    sslmode: require\n", "give either sslmode or the URL's sslmode, not both"),
    ],
    ids=["rootcert", "ssl", "sslmode"],
)
def test_a_url_and_a_key_never_both_give_a_tls_setting(query: str, extra: str, problem: str, pem: Path) -> None:
    url = f"postgres://walflow:canary@db.internal/app{query.format(pem=pem)}"

    problems = errors_of(database(f"    url: '{url}'\n{extra.format(pem=pem)}", where=""))

    assert problems == [f"databases[0].url: {problem}"]
    assert "canary" not in problems[0]
