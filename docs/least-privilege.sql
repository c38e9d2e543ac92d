-- walflow's least-privilege PostgreSQL role. This file is what the tests run
-- (tests/security/test_least_privilege.py): the pipeline, backfills included, streams as the role it makes.
--
-- Run it once, as a superuser, connected to the database walflow streams:
--
--   psql "host=db.example.com dbname=app user=postgres" -f docs/least-privilege.sql \
--        -v role=walflow -v password="$WALFLOW_PG_PASSWORD" -v owner=app \
--        -v publication=walflow_pub -v tables='public.orders, public.customers'
--
--   role         the role walflow logs in as (databases[].username)
--   password     its password (databases[].password, or PGPASSWORD / ~/.pgpass where walflow runs)
--   owner        the role that owns the tables: it creates the publication and grants SELECT
--   publication  databases[].publication.name
--   tables       the tables walflow streams, schema-qualified, comma-separated
--
-- What walflow's role may then do, and nothing more: log in, create and read its replication slot
-- (REPLICATION: walflow creates the slot itself), SELECT the published tables (backfills read them;
-- nothing else does), and write logical messages (its heartbeats and its backfill signals and
-- watermarks). It is not a superuser, owns no table and creates no publication: walflow finds the
-- publication made here (were it missing, walflow would stop with the statement to run).
-- `walflow check` says what is missing of this, and what is more than this (a superuser).

\set ON_ERROR_STOP on
BEGIN;

-- 1. The role: it logs in and streams (REPLICATION), nothing else.
CREATE ROLE :"role" LOGIN REPLICATION PASSWORD :'password';
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'role') \gexec
SELECT DISTINCT format('GRANT USAGE ON SCHEMA %I TO %I', n.nspname, :'role')
FROM unnest(string_to_array(:'tables', ',')) AS t (name)
JOIN pg_class c ON c.oid = trim(t.name)::regclass
JOIN pg_namespace n ON n.oid = c.relnamespace \gexec

-- 2. Logical messages: every role may write them by default (pg_logical_emit_message), into every
--    slot of the database, walflow's included. walflow reads only its own prefixes and checks what
--    it reads (signed backfill signals with walflow.backfill.secret), but only walflow need write them.
--    What revoking costs: nothing for walflow, which is granted them back below; other roles can no
--    longer write logical messages, so grant them back to any role that does, e.g. applications that
--    write Sequin's transaction annotations (sequin:transaction_annotations.set):
--      GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO app_writer;
--    Every variant (text and bytea content; PostgreSQL 17 adds a flush argument) is revoked.
SELECT format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', p.oid::regprocedure)
FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message' \gexec
SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::regprocedure, :'role')
FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message' \gexec

-- 3. As the tables' owner: SELECT for walflow, and the publication, created once (walflow need not
--    create it, and could not: FOR ALL TABLES takes a superuser, FOR TABLE the tables' owner, with
--    CREATE on the database, which its owner has; else GRANT CREATE ON DATABASE ... TO the owner first).
--    A table added later: ALTER PUBLICATION ... ADD TABLE ...; GRANT SELECT ON ... TO walflow's role.
SET ROLE :"owner";
GRANT SELECT ON :tables TO :"role";
CREATE PUBLICATION :"publication" FOR TABLE :tables WITH (publish_via_partition_root = true);
RESET ROLE;

COMMIT;
