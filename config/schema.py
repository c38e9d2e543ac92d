"""The configuration schema: Sequin's YAML for a Postgres source and NATS sinks, plus ``walflow:``.

Every model forbids unknown keys, so a typo is an error that names its path (at the top
level, where Sequin ignores what it does not know, they are dropped with a warning). Keys
that Sequin knows but walflow does not use are listed in a model's ``ignored`` mapping with
the reason, and Sequin values that walflow runs as another in its ``replaced`` mapping; the
loader applies both with one warning each. Sequin's other spellings (a database ``url``, a
sink's ``schema``) are mapped by validators, and keys whose meaning walflow cannot keep are
errors that say what to write instead. Secrets are ``SecretStr``: they print as
``**********`` in ``repr()``, logs and error messages.

Adding a tunable is one line in ``WalflowSettings`` (or in the model it belongs to), with
its default and a comment on why that default.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal, get_args
from urllib.parse import parse_qsl, urlsplit

from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    FilePath,
    HttpUrl,
    PrivateAttr,
    SecretStr,
    Tag,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError

from config.section import Section
from config.shaping import (
    ColumnFilter,
    Columns,
    Condition,
    Enrichment,
    FilterFunction,
    FunctionConfig,
    OnError,
    PathTransform,
    RoutingFunction,
    SubjectRouting,
    ToastPolicy,
    TransformFunction,
    function_spec,
)
from core.display import display_url

Port = Annotated[int, Field(ge=1, le=65535)]
Milliseconds = Annotated[int, Field(gt=0)]
Action = Literal["insert", "update", "delete"]


def _refused(problems: Mapping[str, str], data: Any) -> ValidationError:
    """An error at each key of ``problems`` (key -> message) in the section being validated:
    a ValueError from a model validator would name only the section."""
    return ValidationError.from_exception_data("refused", [
        InitErrorDetails(type=PydanticCustomError("value_error", message), loc=(key,), input=data)
        for key, message in problems.items()
    ])


def _qualified_table(value: str) -> str:
    """``schema.table``; a bare ``table`` is ``public.table``, as Sequin reads it."""
    schema, dot, table = value.partition(".")
    if not dot and schema:
        return f"public.{value}"
    if not schema or not table:
        raise ValueError(f"'{value}' is not a table name: write schema.table (or table, for public.table)")
    return value


def _matching(pattern: str, expected: str) -> AfterValidator:
    """A validator for names that must match ``pattern``; the error says what is ``expected``."""
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"'{value}' is not {expected}")
        return value

    return AfterValidator(check)


QualifiedTable = Annotated[str, AfterValidator(_qualified_table)]
SlotName = Annotated[str, _matching(r"[a-z0-9_]{1,63}", "a valid slot name: use 1-63 lower-case letters, digits and underscores")]
StreamName = Annotated[str, _matching(r"[^\s.*>/\\]{1,255}", "a valid stream name: no spaces, '.', '*', '>', '/' or '\\'")]
SubjectPrefix = Annotated[
    str,
    _matching(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*",
              "a valid subject prefix: dot-separated tokens of letters, digits, '-' and '_'"),
]


# -- databases ---------------------------------------------------------------------------


class SlotConfig(Section):
    name: SlotName
    create_if_not_exists: bool = False


class PublicationConfig(Section):
    ignored: ClassVar[Mapping[str, str]] = {
        "schemas": "Sequin does not read it either: a publication walflow creates is FOR ALL TABLES, as "
                   "Sequin's; to publish some schemas only, write init_sql: CREATE PUBLICATION ... FOR TABLES "
                   "IN SCHEMA ...",
    }

    name: str = Field(min_length=1, max_length=63)
    create_if_not_exists: bool = False
    #: Sequin's statement for creating the publication; default: FOR ALL TABLES.
    init_sql: str | None = None


class AwaitDatabase(Section):
    """How long to wait for the database at startup, as in Sequin."""

    timeout_ms: Milliseconds = 30_000
    interval_ms: Milliseconds = 3_000


#: Where a ``url``'s parts go; Sequin allows none of these keys beside a ``url``.
_URL_KEYS = ("hostname", "port", "database", "username", "password")
#: libpq's ``sslmode``, weakest first, with libpq's meanings: ``disable`` never uses TLS;
#: ``allow`` and ``prefer`` use it when the server (or whoever answers in its place) agrees;
#: ``require`` always encrypts, but checks the certificate only against a ``sslrootcert``
#: given (its CA, not its host name); ``verify-ca`` checks that the certificate is signed by
#: ``sslrootcert``'s CA; ``verify-full`` also that it names ``hostname``.
SslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]
_SSLMODES: Final[tuple[str, ...]] = get_args(SslMode)
#: The modes that never send a byte without TLS (``ssl: true`` is the first).
_ENCRYPTING: Final = frozenset({"require", "verify-ca", "verify-full"})
#: The query parameters a ``url`` may hold, as libpq reads them: the database keys of those names.
_URL_PARAMETERS: Final = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword")
#: A flag as the schema reads one (``false``, ``"false"`` from a reference, ``0`` …).
_FLAG = TypeAdapter(bool)


def _from_url(url: Any) -> tuple[dict[str, Any], str | None]:
    """A ``postgres://user:password@host:port/database?sslmode=…`` URL as database keys, or why it
    cannot be one. The message never repeats the URL, which holds the password."""
    example = "postgres://user:password@host:5432/database"
    if not isinstance(url, str):
        return {}, f"expected a URL like {example}"
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        return {}, f"expected a postgres:// or postgresql:// URL, like {example}"
    if "," in parts.netloc:
        return {}, "give one host: walflow reads the slot of one server"
    try:
        port = parts.port
    except ValueError:
        return {}, f"the port is not a number from 1 to 65535 (a URL like {example})"
    # as Sequin's URI.parse: nothing percent-decoded, the host as written (it is metadata.database.hostname)
    database = parts.path.removeprefix("/")
    userinfo, _, hostport = parts.netloc.rpartition("@")
    host = hostport[1:hostport.find("]")] if hostport.startswith("[") else hostport.partition(":")[0]
    if not host or not database:
        return {}, f"the URL needs a host and a database name, like {example}"
    keys: dict[str, Any] = {"hostname": host, "database": database}
    if port is not None:
        keys["port"] = port
    username, colon, password = userinfo.partition(":")
    if username:
        keys["username"] = username
    if colon:
        keys["password"] = password
    # the query as libpq reads it (percent-decoded): its TLS parameters, under the keys of their names
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in _URL_PARAMETERS:
            return {}, (f"the URL's parameter {name} is not supported; only {', '.join(_URL_PARAMETERS)} are "
                        "(as the database keys of those names)")
        if name in keys:
            return {}, f"the URL gives {name} twice"
        if name == "sslmode" and value not in _SSLMODES:
            return {}, f"the URL's sslmode={value} is not one of libpq's: {', '.join(_SSLMODES)}"
        keys[name] = value
    return keys, None


def _pem_file(what: str, *words: str) -> AfterValidator:
    """A path libpq reads ``what`` from (or one of its ``words``), checked when the config is
    loaded rather than at the first connection; the error says what the file must hold."""

    def check(value: str) -> str:
        if value not in words and not Path(value).is_file():
            raise ValueError(f"no file at {value}: give the PEM file of {what}")
        return value

    return AfterValidator(check)


class DatabaseConfig(Section):
    ignored: ClassVar[Mapping[str, str]] = {
        "pool_size": "walflow opens its own two connections (replication and heartbeats)",
        "tables": "the publication decides which tables are captured; filter per sink with source.*",
        "ipv6": "libpq tries every address the hostname resolves to, IPv6 and IPv4",
    }
    secret_keys: ClassVar[frozenset[str]] = frozenset({"url"})  # Sequin's, with the password

    name: str = Field(min_length=1)
    #: ``metadata.database.id``: Sequin's id of this database (``sequin config export`` writes
    #: it); None: a UUID derived from the name, the same on every run.
    id: str | None = Field(default=None, min_length=1)
    #: ``metadata.database.annotations``, as in Sequin.
    annotations: dict[str, Any] = {}
    hostname: str = Field(min_length=1)
    port: Port = 5432
    database: str = Field(min_length=1)
    username: str = "postgres"
    #: None: libpq's own fallbacks apply (PGPASSWORD, ~/.pgpass).
    password: SecretStr | None = None
    #: Sequin's flag: ``true`` is libpq's ``sslmode=require`` (encrypted, the server *not*
    #: verified: walflow warns once per process, naming the keys to add); ``false`` or unset is
    #: libpq's own default, ``prefer`` (TLS when the server offers it). ``false`` is not
    #: ``disable``, although Sequin's ``false`` never tries TLS: ``prefer`` is never weaker on
    #: the wire (a passive eavesdropper sees nothing when the server has TLS, an active one
    #: can strip it under either), and configs that work today keep working. Given with
    #: ``sslmode``, the two must agree (true: ``require`` or stronger; false: ``prefer`` or
    #: weaker), or the config is refused: a contradiction is a mistake, and guessing which
    #: key was meant could turn verification off.
    ssl: bool = False
    #: libpq's ``sslmode`` (``disable``, ``allow``, ``prefer``, ``require``, ``verify-ca``,
    #: ``verify-full``), with libpq's meanings; None: from ``ssl``. Only ``verify-full`` checks
    #: that the server is the one ``hostname`` names; ``verify-ca`` accepts any server whose
    #: certificate ``sslrootcert``'s CA signed.
    sslmode: SslMode | None = None
    #: The CA certificates (PEM) that verify the server; ``system``: the system's trusted CAs
    #: (libpq's, with ``sslmode: verify-full`` only). None: libpq's ``~/.postgresql/root.crt``.
    #: Refused with ``sslmode`` ``disable``, ``allow`` or ``prefer``, which never look at it.
    sslrootcert: Annotated[str, _pem_file("the CA that signed the server's certificate (or system, for the "
                                          "system's trusted CAs)", "system")] | None = None
    #: A client certificate (PEM) for servers that ask for one (``clientcert`` in pg_hba.conf), with ``sslkey``.
    sslcert: Annotated[str, _pem_file("the client certificate")] | None = None
    #: ``sslcert``'s private key; libpq refuses a key file that others may read (mode 0600).
    sslkey: Annotated[str, _pem_file("the client certificate's private key")] | None = None
    #: The passphrase of an encrypted ``sslkey``.
    sslpassword: SecretStr | None = None
    slot: SlotConfig
    publication: PublicationConfig
    await_database: AwaitDatabase = AwaitDatabase()

    @model_validator(mode="before")
    @classmethod
    def _legacy_names(cls, data: Any) -> Any:
        """Older Sequin configs say ``slot_name``/``publication_name``; both forms are accepted."""
        if isinstance(data, dict):
            data = dict(data)
            for legacy, key in (("slot_name", "slot"), ("publication_name", "publication")):
                if legacy in data:
                    if key in data:
                        raise ValueError(f"give either {key}.name or {legacy}, not both")
                    data[key] = {"name": data.pop(legacy)}
        return data

    @model_validator(mode="before")
    @classmethod
    def _sequin_connection(cls, data: Any) -> Any:
        """Sequin's other ways to say where the database is: ``url`` is mapped onto hostname, port,
        database, username, password and ssl; ``use_local_tunnel: false`` (connect directly) is
        what walflow does; a tunnel or a ``primary`` beside a standby cannot be honoured."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        problems: dict[str, str] = {}
        if "url" in data:
            keys, problem = _from_url(data.pop("url"))
            given = [key for key in _URL_KEYS if data.get(key) is not None]
            if problem is None and given:
                problem = f"give either url or {', '.join(given)}, not both (as in Sequin)"
            if problem is None and "sslmode" in keys and data.get("ssl") is not None:
                problem = "give either ssl or the URL's sslmode, not both"
            twice = [key for key in _URL_PARAMETERS if key in keys and data.get(key) is not None]
            if problem is None and twice:
                problem = f"give either {twice[0]} or the URL's {twice[0]}, not both"
            if problem is None:
                data.update(keys)
            else:
                problems["url"] = problem
        try:
            tunnel = _FLAG.validate_python(data.pop("use_local_tunnel", False))
        except ValidationError:
            problems["use_local_tunnel"] = "Input should be a valid boolean"
        else:
            if tunnel:
                problems["use_local_tunnel"] = (
                    "walflow connects to the database directly, not through Sequin Cloud's tunnel; point hostname "
                    "and port at the tunnel's local end (or at the database), and remove use_local_tunnel"
                )
        if data.get("primary") is not None:
            problems["primary"] = (
                "walflow reads the slot on the server it connects to and writes its heartbeats and backfill "
                "watermarks there (pg_logical_emit_message), which a standby cannot take; point hostname at the "
                "primary and remove primary:"
            )
        if problems:
            raise _refused(problems, data)
        data.pop("primary", None)  # null: none, as Sequin reads it
        return data

    @model_validator(mode="after")
    def _tls_keys_agree(self) -> DatabaseConfig:
        """TLS keys that contradict each other, or that libpq would ignore, are refused: each
        is a mistake that would leave the server less verified than the config reads."""
        problems: dict[str, str] = {}
        mode = self.libpq_sslmode
        if self.sslmode is not None and "ssl" in self.model_fields_set and self.ssl != (mode in _ENCRYPTING):
            problems["ssl"] = (f"ssl: {str(self.ssl).lower()} and sslmode: {mode} disagree (ssl: true is sslmode "
                               "require or stronger, false prefer or weaker): remove ssl, sslmode says it all")
        if self.sslrootcert == "system" and mode != "verify-full":
            problems["sslrootcert"] = (f"sslrootcert: system needs sslmode: verify-full (it is {mode}), as libpq "
                                       "requires: any server with a public certificate would pass a weaker check")
        elif self.sslrootcert is not None and mode not in _ENCRYPTING:
            problems["sslrootcert"] = (f"sslmode {mode} never checks the server's certificate, so sslrootcert would "
                                       "be ignored: set sslmode: verify-full")
        if (self.sslcert is None) != (self.sslkey is None):
            problems["sslkey" if self.sslkey is None else "sslcert"] = (
                "a client certificate takes both sslcert (its PEM file) and sslkey (its private key's)")
        if self.sslpassword is not None and self.sslkey is None:
            problems["sslpassword"] = "sslpassword decrypts sslkey: give sslcert and sslkey, or remove sslpassword"
        if problems:
            raise _refused(problems, self)
        return self

    @property
    def libpq_sslmode(self) -> SslMode:
        """The ``sslmode`` walflow's connections use: ``sslmode``, else ``ssl`` as libpq's mode."""
        if self.sslmode is not None:
            return self.sslmode
        return "require" if self.ssl else "prefer"

    @property
    def verifies_server(self) -> bool:
        """Whether libpq checks the server's certificate against a CA (``verify-*``)."""
        return self.libpq_sslmode in ("verify-ca", "verify-full")


# -- sinks -------------------------------------------------------------------------------


class SourceFilter(Section):
    """Which published tables a sink receives; None means no restriction."""

    include_schemas: list[str] | None = None
    exclude_schemas: list[str] | None = None
    include_tables: list[QualifiedTable] | None = None
    exclude_tables: list[QualifiedTable] | None = None


#: A sink's (or table's) function key: the name of one of ``functions:`` (resolved by
#: :class:`Config` into walflow's form), ``none``, or walflow's form in place.
NoneWord = Literal["none"]


def _form_of(value: Any) -> str:
    """Which form a function key holds, so that an error names that form's keys only (pydantic
    would report every member of the union): the tags are left out of error paths by the loader."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "form:python" if "python" in value else "form:mapping"
    if isinstance(value, (PathTransform, SubjectRouting, Enrichment)):
        return "form:mapping"
    if isinstance(value, (FilterFunction, TransformFunction, RoutingFunction)):
        return "form:python"
    return "str"


_NONE = Annotated[NoneWord, Tag("str")]
_NULL = Annotated[None, Tag("null")]
_PICK = Discriminator(_form_of)
# The types of the function keys: ``none``, the mapping form, the ``python:`` form, or null.
FilterKey = Annotated[_NONE | Annotated[FilterFunction, Tag("form:python")] | _NULL, _PICK]
TransformKey = Annotated[
    _NONE | Annotated[PathTransform, Tag("form:mapping")] | Annotated[TransformFunction, Tag("form:python")] | _NULL,
    _PICK,
]
RoutingKey = Annotated[
    _NONE | Annotated[SubjectRouting, Tag("form:mapping")] | Annotated[RoutingFunction, Tag("form:python")] | _NULL,
    _PICK,
]
EnrichmentKey = Annotated[_NONE | Annotated[Enrichment, Tag("form:mapping")] | _NULL, _PICK]


class TableConfig(Section):
    """Per-table settings (Sequin's ``tables``): the columns that group a row's changes, and
    what is published of the table (``config/shaping.py``): a table's keys apply beside, or
    in place of, the sink's."""

    name: QualifiedTable
    #: None: the table's primary key (Sequin's export writes ``[]`` for that).
    group_column_names: list[str] | None = None
    #: Sequin's column filters: a row is published when all of them hold.
    filters: list[ColumnFilter] = []
    #: walflow's conditions on column values: a row is published when all of them hold.
    where: list[Condition] = []
    #: A row filter in Python, with the sink's ``filter`` (both must pass).
    filter: FilterKey = None
    #: Which columns are published, renamed, masked.
    columns: Columns | None = None
    #: Unchanged TOAST values; None: the sink's ``toast``.
    toast: ToastPolicy | None = None
    #: In place of the sink's ``routing`` for this table.
    routing: RoutingKey = None
    #: In place of the sink's ``enrichment`` for this table.
    enrichment: EnrichmentKey = None

    @field_validator("group_column_names")
    @classmethod
    def _empty_is_key(cls, value: list[str] | None) -> list[str] | None:
        return value or None


class StreamConfig(Section):
    """The JetStream stream that stores the events; created when missing unless told not to."""

    name: StreamName = "WALFLOW"
    create_if_not_exists: bool = True
    #: None: ``<subject_prefix>.<database>.>`` (``connectors/nats/stream.py``).
    subjects: list[str] | None = None
    storage: Literal["file", "memory"] = "file"
    replicas: int = Field(default=1, ge=1, le=5)
    #: JetStream drops a re-published Nats-Msg-Id within this window (its default, 2 minutes).
    duplicate_window_ms: Milliseconds = 120_000
    #: 0 / -1: unlimited, as in JetStream.
    max_age_ms: int = Field(default=0, ge=0)
    max_bytes: int = Field(default=-1, ge=-1)
    max_msgs: int = Field(default=-1, ge=-1)


class NatsDestination(Section):
    """Sequin's NATS sink keys (host, port, credentials, tls) plus walflow's additions."""

    ignored: ClassVar[Mapping[str, str]] = {
        "connection_id": "Sequin's id of its NATS connection; walflow names its connections itself",
    }

    type: Literal["nats"]
    host: str | None = None
    port: Port = 4222
    #: Several servers (``nats://a:4222``); replaces host/port. A URL may hold credentials
    #: (``nats://user:password@a:4222``, ``nats://token@a:4222``): walflow never prints them.
    servers: list[str] | None = Field(default=None, min_length=1, repr=False)
    username: str | None = None
    password: SecretStr | None = None
    #: A token the server's ``authorization { token: … }`` expects (instead of a user), or an
    #: auth callout reads (sent along with a JWT or nkey signature).
    token: SecretStr | None = None
    #: A user JWT, with its user's ``nkey_seed`` (or ``nkey_seed_file``); or both in ``creds_file``.
    jwt: SecretStr | None = None
    #: An nkey user's seed (``SU…``).
    nkey_seed: SecretStr | None = None
    #: The file that holds the seed, instead of ``nkey_seed``.
    nkey_seed_file: FilePath | None = None
    #: A ``.creds`` file (``nsc generate creds``): the user JWT and its seed.
    creds_file: FilePath | None = None
    #: TLS, verified against the system's CAs or ``tls_ca_file``. walflow never sends its
    #: credentials (nor anything else) over a connection that did not become TLS, whatever the
    #: server's INFO says; also on with a ``tls://`` server URL or any other ``tls_*`` key.
    tls: bool = False
    #: The CA certificate(s) (PEM) that signed the servers' certificates, instead of the system's.
    tls_ca_file: FilePath | None = None
    #: A client certificate (chain, PEM) and its private key, for servers that verify clients
    #: (``tls { verify: true }``); they go together.
    tls_cert_file: FilePath | None = None
    #: The private key of ``tls_cert_file`` (PEM, not encrypted).
    tls_key_file: FilePath | None = None
    #: TLS from the first byte, before the server's INFO, for servers with
    #: ``tls { handshake_first: true }``: nothing is ever exchanged in clear.
    tls_handshake_first: bool = False
    #: Where replies to walflow's requests arrive (JetStream's acknowledgements and API
    #: answers): ``<inbox_prefix>.>`` is what walflow's NATS user subscribes to. A prefix of
    #: walflow's own keeps other users of the account from reading its replies.
    inbox_prefix: SubjectPrefix = "_INBOX"
    #: Sequin's subjects start with ``sequin``; ``config/walflow.yaml`` sets ``walflow``.
    subject_prefix: SubjectPrefix = "sequin"
    #: ``Nats-Msg-Id`` and ``metadata.idempotency_key``: walflow's (names database and sink,
    #: so sinks can share a stream) or Sequin's ``base64("<commit_lsn>:<commit_idx>")``, for a
    #: cutover with Sequin publishing into the same stream (README, "Migrating from Sequin").
    msg_id: Literal["walflow", "sequin"] = "walflow"
    stream: StreamConfig = StreamConfig()
    #: Messages published but not yet acknowledged, per sink partition.
    max_in_flight: int = Field(default=1024, ge=1)
    #: A message without an acknowledgement after this is re-sent (JetStream dedupes it).
    ack_timeout_ms: Milliseconds = 10_000
    #: The slot's confirmed position trails JetStream's acknowledgements by at least this
    #: long, so Postgres still holds every change a server may lose after acknowledging it:
    #: JetStream syncs its store to disk every ``sync_interval`` (2 minutes by default), and a
    #: stream that comes back without some of them is repaired from the slot (README,
    #: "Guarantees"). 0 for servers with ``sync_interval: always``. It keeps positions only,
    #: never messages: the cost is WAL the slot holds and what a restart reads again.
    confirm_delay_ms: int = Field(default=150_000, ge=0)
    #: The servers' monitoring endpoints (``http://nats-1:8222``): ``walflow check`` reads each
    #: one's sync policy there (``/varz``) to say whether ``confirm_delay_ms`` covers it.
    monitoring_urls: list[HttpUrl] | None = Field(default=None, min_length=1, repr=False)

    @model_validator(mode="after")
    def _connection(self) -> NatsDestination:
        if (self.host is None) == (self.servers is None):
            raise ValueError("set either host (with port) or servers, exactly one of them")
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together: set both or neither")
        if self.creds_file is not None and (self.jwt, self.nkey_seed, self.nkey_seed_file) != (None, None, None):
            raise ValueError("creds_file already holds the JWT and nkey seed: drop jwt/nkey_seed/nkey_seed_file, "
                             "or drop creds_file")
        if self.nkey_seed is not None and self.nkey_seed_file is not None:
            raise ValueError("nkey_seed and nkey_seed_file are the same seed given twice: keep one of them")
        if self.jwt is not None and self.nkey_seed is None and self.nkey_seed_file is None:
            raise ValueError("jwt needs its user's seed to sign the server's challenge: set nkey_seed (or "
                             "nkey_seed_file), or give both in creds_file")
        if self.token is not None and self.username is not None:
            # nats-py sends one of them, the password. (A token *with* a JWT or an nkey is sent
            # along with the signature, for auth callouts; a user with a JWT is Sequin's own
            # reference config: the server's nonce decides which nats-py sends.)
            raise ValueError("username/password and token are two ways to log in, and walflow would send only the "
                             "password: keep the one the server's authorization expects")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together (a client certificate and its key): "
                             "set both or neither")
        return self

    @property
    def logs_in(self) -> bool:
        """Whether any credentials are configured (a user, token, creds file, JWT or nkey)."""
        return any(value is not None for value in (self.username, self.token, self.creds_file, self.jwt, self.nkey_seed,
                                                   self.nkey_seed_file))

    @property
    def uses_tls(self) -> bool:
        """Whether the connection must be TLS: ``tls``, any ``tls_*`` key, or a ``tls://`` server."""
        return (self.tls or self.tls_handshake_first or self.tls_ca_file is not None
                or self.tls_cert_file is not None or any(url.startswith("tls://") for url in self.servers or ()))

    @property
    def server_urls(self) -> list[str]:
        if self.servers is not None:
            return list(self.servers)
        scheme = "tls" if self.uses_tls else "nats"
        return [f"{scheme}://{self.host}:{self.port}"]

    @property
    def display_urls(self) -> list[str]:
        """``server_urls`` as walflow prints them, ``scheme://host:port``: a URL may hold
        credentials (:func:`core.display.display_url`)."""
        return [display_url(url) for url in self.server_urls]


#: Where a sink publishes, chosen by its ``type``. One kind today (NATS JetStream); another is
#: one more model in this union and a connector beside ``connectors/nats``.
Destination = Annotated[NatsDestination, Field(discriminator="type")]

class InitialBackfill(Section):
    """One table of a sink's ``initial_backfill`` list: all of it, or from a sort column's position on."""

    table: QualifiedTable
    type: Literal["full", "partial"] = "full"
    #: ``partial``: rows whose ``sort_column`` is at or after ``start_position`` (in the column's own type).
    sort_column: str | None = Field(default=None, min_length=1)
    start_position: str | None = None

    @field_validator("start_position", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        """YAML reads ``2025-01-01`` or ``100`` as a date or a number: Postgres parses the text."""
        return value if value is None or isinstance(value, str) else str(value)

    @model_validator(mode="after")
    def _partial(self) -> InitialBackfill:
        if self.type == "partial" and (self.sort_column is None or self.start_position is None):
            raise ValueError("a partial backfill needs sort_column and start_position")
        if self.type == "full" and (self.sort_column is not None or self.start_position is not None):
            raise ValueError("sort_column and start_position belong to type: partial")
        return self


#: What ``sequin config export`` writes about a sink's state in Sequin, not its configuration.
_SEQUIN_BOOKKEEPING = "Sequin's bookkeeping (sequin config export writes it), not configuration"


class SinkConfig(Section):
    ignored: ClassVar[Mapping[str, str]] = {
        "batch_size": "walflow batches by itself (many messages in flight, acknowledged per epoch)",
        "batch_timeout_ms": "walflow batches by itself",
        "max_retry_count": "walflow never discards a change: it retries until JetStream accepts it",
        "load_shedding_policy": "walflow never sheds load: a slow sink slows the reader down",
        "max_memory_mb": "walflow bounds memory for the whole pipeline: set walflow.max_memory_mb",
        "ack_wait_ms": "only used by Sequin Stream sinks",
        "max_ack_pending": "only used by Sequin Stream sinks",
        "max_waiting": "only used by Sequin Stream sinks",
        "max_deliver": "only used by Sequin Stream sinks",
        "message_kind": "Sequin ignores it since v0.14 and publishes the whole message (record, changes, "
        "action, metadata); so does walflow",
        "consumer_start": "Sequin ignores it too (it started its former record consumers); to publish the rows "
                          "a table has, set initial_backfill",
        "active_backfill": "a backfill running in Sequin does not carry over; request one with walflow backfill",
        "active_backfills": "a backfill running in Sequin does not carry over; request one with walflow backfill",
        "health": "Sequin's health report at export; walflow reports its own at /healthz and /readyz",
        "inserted_at": _SEQUIN_BOOKKEEPING,
        "updated_at": _SEQUIN_BOOKKEEPING,
        "account_id": _SEQUIN_BOOKKEEPING,
        "replication_slot_id": _SEQUIN_BOOKKEEPING,
        "sequence_id": _SEQUIN_BOOKKEEPING,
    }
    replaced: ClassVar[Mapping[str, Mapping[str, tuple[str, str]]]] = {
        "status": {"paused": (
            "disabled",
            ("walflow cannot hold a paused sink's changes without holding the slot's WAL; to resume without a "
             "gap, set status: active and request a backfill (walflow backfill --sink NAME --table SCHEMA.TABLE)"),
        )},
    }

    name: str = Field(min_length=1)
    #: ``metadata.consumer.id``: Sequin's id of this sink (``sequin config export`` writes it);
    #: None: a UUID derived from the database and sink names, the same on every run.
    id: str | None = Field(default=None, min_length=1)
    database: str
    status: Literal["active", "disabled"] = "active"
    actions: list[Action] = Field(default=["insert", "update", "delete"], min_length=1)
    source: SourceFilter = SourceFilter()
    #: Older Sequin form: one table per sink (``schema.table``).
    table: QualifiedTable | None = None
    tables: list[TableConfig] = []
    #: Older Sequin form, with ``table``: that table's group columns.
    group_column_names: list[str] | None = None
    message_grouping: bool = True
    #: Sink partitions: ordered publishers that group keys are spread over, and Bytewax
    #: spreads over its workers (Sequin's key, with a meaning close to Sequin's).
    partition_count: int = Field(default=4, ge=1, le=256)
    annotations: dict[str, Any] = {}
    timestamp_format: Literal["iso8601", "unix_microsecond"] = "iso8601"
    #: When the sink is first started: backfill every table it reads (true), or these.
    initial_backfill: Annotated[
        # tags as pydantic names union members, so error paths read sinks[0].initial_backfill[0].table
        Annotated[bool, Tag("bool")] | Annotated[list[InitialBackfill], Tag("list[InitialBackfill]")],
        Discriminator(lambda value: "list[InitialBackfill]" if isinstance(value, list) else "bool"),
    ] = False
    #: A row filter: a function's name, ``none``, or ``{python: module:function}``.
    filter: FilterKey = None
    #: The payload: the envelope (None, ``none``), a path of it (``{path: record}``), or ``{python: …}``.
    transform: TransformKey = None
    #: Subject and headers: default ``<prefix>.<database>.<schema>.<table>.<action>``.
    routing: RoutingKey = None
    #: ``metadata.enrichment`` from a SQL query per batch.
    enrichment: EnrichmentKey = None
    #: Older Sequin form, with ``table``: that table's column filters.
    filters: list[ColumnFilter] = []
    #: The payload's shape: Sequin's (``record``, ``changes``, ``action``, ``metadata``) or
    #: Debezium's (``before``, ``after``, ``op``, ``source``, ``ts_ms``).
    envelope: Literal["sequin", "debezium"] = "sequin"
    #: Unchanged TOAST values, for tables that do not say (``tables[].toast``).
    toast: ToastPolicy = "placeholder"
    #: When shaping a message fails (see ``config/shaping.py``'s ``OnError``).
    on_error: OnError = "stop"
    #: Where ``on_error: dead_letter`` publishes (the placeholders of ``routing.subject``,
    #: without the row's values); the stream must capture it.
    dead_letter_subject: str = "{prefix}.{database}.dead_letter"
    #: How a transaction's changes reach the stream: ``none``, each message on its own (as
    #: Sequin); ``atomic``, as JetStream atomic batches, so a reader sees all of a transaction
    #: or none of it (the README's "Transactions"). Needs nats-server 2.12 or later.
    transactions: Literal["none", "atomic"] = "none"
    #: A BEGIN and an END event (``<prefix>.<database>._transaction.begin``/``.end``) around
    #: each transaction the sink publishes anything of, in stream order, with Debezium's fields.
    transaction_markers: bool = False
    #: An event on ``<prefix>.<database>.<schema>.<table>.schema`` when a published table's
    #: columns, types, key or replica identity change, stored before its first change of the new shape.
    schema_events: bool = False
    destination: Destination

    @field_validator("actions")
    @classmethod
    def _unique_actions(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    @field_validator("source", "tables", "initial_backfill", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        """Sequin reads null as not given (its export writes ``tables:`` empty for a sink without
        per-table settings)."""
        if value is None and info.field_name is not None:
            return cls.model_fields[info.field_name].get_default(call_default_factory=True)
        return value

    @field_validator("group_column_names")
    @classmethod
    def _empty_is_key(cls, value: list[str] | None) -> list[str] | None:
        return value or None

    @model_validator(mode="before")
    @classmethod
    def _legacy_schema(cls, data: Any) -> Any:
        """Older Sequin configs say ``schema: public`` for every table of a schema: Sequin reads it as
        ``source: {include_schemas: [public]}``, and so does walflow."""
        if not isinstance(data, dict) or "schema" not in data:
            return data
        data = dict(data)
        schema = data.pop("schema")
        source = data.get("source") or {}
        if isinstance(source, dict):
            if source.get("include_schemas") is not None:
                raise _refused({"schema": "give either schema or source.include_schemas, not both"}, data)
            data["source"] = {**source, "include_schemas": [schema]}
        return data

    @model_validator(mode="after")
    def _grouping(self) -> SinkConfig:
        if self.group_column_names is not None and self.table is None:
            raise ValueError("group_column_names at sink level needs table: (or use tables: [{name, group_column_names}])")
        if not self.message_grouping and (self.group_column_names or any(t.group_column_names for t in self.tables)):
            raise ValueError("group columns are set but message_grouping is false: remove one of them")
        if self.filters and self.table is None:
            raise ValueError("filters at sink level needs table: (or use tables: [{name, filters}])")
        if self.in_commit_order and "partition_count" in self.model_fields_set and self.partition_count > 1:
            raise ValueError("transactions: atomic and transaction_markers publish the sink's transactions in commit "
                             "order, from one partition: remove partition_count (or set it to 1)")
        names = [t.name for t in self.tables]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"tables[{i}]: {name} is listed twice (as tables[{names.index(name)}] too): "
                                 "give each table one entry, with all of its settings")
        return self

    @property
    def enabled(self) -> bool:
        return self.status == "active"

    @property
    def in_commit_order(self) -> bool:
        """The sink publishes whole transactions in commit order (atomic batches, or markers
        around them): from one partition, since two partitions' messages interleave freely."""
        return self.transactions == "atomic" or self.transaction_markers

    @property
    def partitions(self) -> int:
        """How many partitions the sink publishes from: 1 in commit order, else ``partition_count``."""
        return 1 if self.in_commit_order else self.partition_count

    def reads(self, schema: str, qualified: str) -> bool:
        """Whether the sink's ``source:`` rules and its legacy ``table:`` admit the table
        ``qualified`` (``schema.table``, names exactly as Postgres stores them): the same rule
        for its live changes and for the backfills it may be asked for."""
        source = self.source
        return (
            (source.include_schemas is None or schema in source.include_schemas)
            and schema not in (source.exclude_schemas or ())
            and (source.include_tables is None or qualified in source.include_tables)
            and (self.table is None or qualified == self.table)
            and qualified not in (source.exclude_tables or ())
        )


# -- walflow's own settings ---------------------------------------------------------------


#: ``walflow.max_change_mb``'s default, in bytes (see :class:`WalflowSettings`).
DEFAULT_MAX_CHANGE: Final = 8 * 1024 * 1024


class _ReadsChanges(Section):
    """A section whose reader needs ``walflow.max_change_mb`` (:class:`WalflowSettings` hands it
    down): the replication connection decodes changes, a backfill reads rows."""

    _max_change: int = PrivateAttr(default=DEFAULT_MAX_CHANGE)

    @property
    def max_change_bytes(self) -> int:
        """``walflow.max_change_mb`` in bytes: a change (or a read row) larger than this has its
        largest values replaced by markers (``core/sizes.py``)."""
        return self._max_change


class ReplicationSettings(_ReadsChanges):
    """The replication connection: how it stays alive and how much it may hold."""

    #: Set on walflow's own connection: a hung or vanished walflow frees its slot after this
    #: (the server default, 60 s, is what kept Sequin's slot "active for PID …").
    wal_sender_timeout_ms: Milliseconds = 15_000
    #: Standby status updates at least this often, even while the pipeline is not reading;
    #: a walflow connection silent for three of these is taken to be hung and is replaced.
    status_interval_ms: Milliseconds = 2_000
    #: Memory of changes decoded but not yet taken by the dataflow (estimated from their WAL
    #: size); beyond it the reader stops reading, keeps the connection alive, and waits.
    buffer_mb: int = Field(default=32, ge=1)
    #: Changes handed to Bytewax per ``next_batch`` call at most (fewer when fewer are
    #: waiting): larger batches spread Bytewax's and the sink's per-call costs (4,000 was
    #: ~10% less CPU per change than 1,000 and than 10,000 in ``./run.sh bench``).
    batch_size: int = Field(default=4000, ge=1)
    #: A ``pg_logical_emit_message`` heartbeat this often (0: none): it moves the slot on an
    #: idle database and measures the round trip that readiness checks.
    heartbeat_interval_ms: int = Field(default=5_000, ge=0)

    @model_validator(mode="after")
    def _keepalive_rule(self) -> ReplicationSettings:
        if self.wal_sender_timeout_ms and self.status_interval_ms * 3 > self.wal_sender_timeout_ms:
            raise ValueError(
                "status_interval_ms must be at most a third of wal_sender_timeout_ms, "
                "or the server may drop a connection that is only slow"
            )
        return self


class BackfillSettings(_ReadsChanges):
    """How backfills read tables (``README.md``, "Backfills")."""

    #: Tables read at the same time (each on a connection of its own); more wait their turn.
    max_concurrent: int = Field(default=2, ge=1, le=32)
    #: A chunk's ``SELECT`` should take about this long: the chunk size adapts to it
    #: (Sequin's default page timeout is 5 s; a shorter budget keeps watermark windows, and
    #: so the rows held in memory and the slot's unconfirmed tail, small).
    query_budget_ms: Milliseconds = 1_000
    #: The first chunk's rows, and the most a chunk may ever hold.
    initial_chunk_rows: int = Field(default=2_000, ge=1)
    max_chunk_rows: int = Field(default=50_000, ge=1)
    #: The most a chunk may hold in memory (estimated like changes); the chunk shrinks to fit.
    max_chunk_mb: int = Field(default=16, ge=1)
    #: Backfills one sink may have running or waiting at once; a request past it is refused
    #: (logged, counted in walflow_ignored_messages_total). Any database role can write a
    #: request into the slot: this bounds what forged ones can queue. A sink's
    #: initial_backfill may not name more tables than this.
    max_pending: int = Field(default=64, ge=1, le=10_000)
    #: Signs every backfill signal walflow writes (HMAC-SHA256), and makes walflow act only on
    #: signed ones: then only who holds the key (walflow, and `walflow backfill` with this
    #: config) can start, resume or end a backfill. Unset, any role that may call
    #: pg_logical_emit_message can ask for a backfill of a table a sink already reads. Change
    #: it only while no backfill runs (one signed with the old key is not resumed).
    secret: SecretStr | None = None


class HealthSettings(Section):
    """The HTTP health endpoint (``/healthz``, ``/readyz``, ``/metrics``). With credentials
    set, ``/readyz`` and ``/metrics`` answer only requests that carry them (HTTP basic
    with username and password, or a bearer token); ``/healthz`` says only that the process
    answers, so it stays open for liveness probes, which carry no credentials."""

    enabled: bool = True
    #: Loopback by default; another address lets other hosts read the endpoint: set credentials then.
    host: str = "127.0.0.1"
    port: Port = 9187
    #: HTTP basic authentication, with ``password``.
    username: str | None = Field(default=None, min_length=1)
    #: ``${WALFLOW_HEALTH_PASSWORD}``.
    password: SecretStr | None = None
    #: A bearer token (``Authorization: Bearer …``) instead of username and password:
    #: ``${WALFLOW_HEALTH_TOKEN}``.
    token: SecretStr | None = None

    @model_validator(mode="after")
    def _one_credential(self) -> HealthSettings:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together: set both or neither")
        if self.token is not None and self.username is not None:
            raise ValueError("set either token or username and password, not both")
        for key in ("password", "token"):
            secret: SecretStr | None = getattr(self, key)
            if secret is not None and not secret.get_secret_value():
                raise ValueError(f"{key} is empty: an endpoint open to anyone who sends it; is its variable set?")
        return self

    @property
    def authorization(self) -> str | None:
        """The ``Authorization`` header a request must carry (what ``walflow status`` sends),
        None when the endpoint is open."""
        if self.token is not None:
            return f"Bearer {self.token.get_secret_value()}"
        if self.username is not None and self.password is not None:
            pair = f"{self.username}:{self.password.get_secret_value()}".encode()
            return f"Basic {base64.b64encode(pair).decode()}"
        return None


class WalflowSettings(Section):
    """Tunables that Sequin's format has no place for. One line each."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    #: ``text``: one ``key=value`` line per event, for people; ``json``: one JSON object per line, for machines.
    log_format: Literal["text", "json"] = "text"
    #: Changes the source hands to the dataflow per epoch (estimated memory): what can be in
    #: flight between workers and to NATS at once. Sequin's per-sink max_memory_mb, as one
    #: bound for the pipeline; the reader's own buffer is replication.buffer_mb on top.
    max_memory_mb: int = Field(default=128, ge=8)
    #: The largest change published whole, measured as its WAL message (a backfill's read: the
    #: row's texts); a larger one has its largest values replaced by a marker until it fits,
    #: before they are copied (README, "Values too large to publish"). 8 MB: NATS advises no
    #: larger max_payload (it warns above it), so a bigger change could not be published whole.
    max_change_mb: float = Field(default=DEFAULT_MAX_CHANGE / (1024 * 1024), gt=0)
    replication: ReplicationSettings = ReplicationSettings()
    backfill: BackfillSettings = BackfillSettings()
    health: HealthSettings = HealthSettings()
    #: The key of ``hash`` masks that do not give their own ``secret``: ``${WALFLOW_MASK_SECRET}``.
    mask_secret: SecretStr | None = None
    #: Recovery partitions made when ``-r DIR`` does not exist yet: at least the most
    #: workers the pipeline will ever run with (Bytewax fixes the count at creation).
    recovery_partitions: int = Field(default=8, ge=1)

    # The sections whose readers apply max_change_mb get it (copies: a default section is one
    # object shared by every config). A comment, not a docstring: the reference lists those as
    # what a section accepts.
    @model_validator(mode="after")
    def _hand_down_max_change(self) -> WalflowSettings:
        limit = int(self.max_change_mb * 1024 * 1024)
        for name in ("replication", "backfill"):
            section: _ReadsChanges = getattr(self, name).model_copy()
            section._max_change = limit
            object.__setattr__(self, name, section)  # frozen: set once, while validating
        return self


class Config(Section):
    unknown_keys: ClassVar[str | None] = (
        "not a walflow or Sequin key (Sequin ignores unknown top-level keys too, e.g. the base of a YAML anchor)"
    )
    ignored: ClassVar[Mapping[str, str]] = {
        "account": "walflow has no accounts",
        "users": "walflow has no users",
        "api_tokens": "walflow has no API",
        "http_endpoints": "walflow only has NATS sinks",
        "change_retentions": "walflow does not write change tables",
    }

    databases: list[DatabaseConfig] = Field(min_length=1)
    #: Sequin's functions, which sinks name in filter, transform, routing and enrichment.
    functions: list[FunctionConfig] = []
    sinks: list[SinkConfig] = Field(min_length=1)
    walflow: WalflowSettings = WalflowSettings()

    @model_validator(mode="before")
    @classmethod
    def _functions(cls, data: Any) -> Any:
        """A sink's (or its table's) ``filter``, ``transform``, ``routing`` and ``enrichment``
        that name one of ``functions:`` are replaced by that function in walflow's form; an
        Elixir function is an error that says what to write in Python."""
        if not isinstance(data, dict):
            return data
        if not isinstance(data.get("sinks"), list):
            return data
        functions: dict[str, FunctionConfig] = {}
        broken: set[str] = set()  # reported where the list itself is validated, not again per sink
        for raw in data.get("functions") or []:
            try:
                function = FunctionConfig.model_validate(raw)
            except ValidationError:
                if isinstance(raw, dict) and isinstance(raw.get("name"), str):
                    broken.add(raw["name"])
                continue
            functions.setdefault(function.name, function)
        problems: list[tuple[tuple[str | int, ...], str]] = []
        sinks = data["sinks"] = [dict(s) if isinstance(s, dict) else s for s in data["sinks"]]
        for i, sink in enumerate(sinks):
            if not isinstance(sink, dict):
                continue
            places: list[tuple[tuple[str | int, ...], dict[str, Any]]] = [(("sinks", i), sink)]
            if isinstance(sink.get("tables"), list):
                sink["tables"] = [dict(t) if isinstance(t, dict) else t for t in sink["tables"]]
                places += [(("sinks", i, "tables", j), t) for j, t in enumerate(sink["tables"]) if isinstance(t, dict)]
            for loc, section in places:
                for kind in ("filter", "transform", "routing", "enrichment"):
                    name = section.get(kind)
                    if not isinstance(name, str) or name == "none" or (kind == "transform" and len(loc) > 2):
                        continue
                    if name in broken:
                        section[kind] = "none"
                        continue
                    found = functions.get(name)
                    if found is None:
                        known = ", ".join(sorted(functions)) or "none are defined"
                        problems.append(((*loc, kind), f"no function named '{name}' in functions: ({known})"))
                        continue
                    try:
                        section[kind] = function_spec(found, kind)
                    except ValueError as exc:
                        problems.append(((*loc, kind), str(exc)))
        if problems:
            raise ValidationError.from_exception_data("refused", [
                InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=data)
                for loc, message in problems
            ])
        return data

    @model_validator(mode="after")
    def _mask_secrets(self) -> Config:
        if self.walflow.mask_secret is not None:
            return self
        for i, sink in enumerate(self.sinks):
            for j, table in enumerate(sink.tables):
                for column, mask in (table.columns.mask.items() if table.columns else ()):
                    if mask.hash and mask.secret is None:
                        raise ValueError(
                            f"sinks[{i}].tables[{j}].columns.mask.{column}: a hash needs a secret: set "
                            "walflow.mask_secret (e.g. ${WALFLOW_MASK_SECRET}) or the mask's secret:")
        return self

    @model_validator(mode="after")
    def _references(self) -> Config:
        _unique("databases", [d.name for d in self.databases])
        _unique("sinks", [s.name for s in self.sinks])
        names = [d.name for d in self.databases]
        for i, sink in enumerate(self.sinks):
            if sink.database not in names:
                raise ValueError(
                    f"sinks[{i}].database: '{sink.database}' is not a database in this file "
                    f"(databases: {', '.join(names)})"
                )
        return self

    def database(self, name: str) -> DatabaseConfig:
        return next(d for d in self.databases if d.name == name)


def _unique(section: str, names: list[str]) -> None:
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ValueError(f"{section}[{i}].name: '{name}' is used twice; names must be unique")


__all__ = [
    "Config",
    "DatabaseConfig",
    "NatsDestination",
    "Section",
    "SinkConfig",
    "StreamConfig",
    "WalflowSettings",
]
