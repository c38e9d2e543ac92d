#!/usr/bin/env bash
# walflow's one entry point: setup, test, run (and demo). See README.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
STAMP="$VENV/.walflow-setup"

say() { printf 'walflow: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

usage() {
    cat >&2 <<'EOF'
usage: ./run.sh COMMAND [ARGS...]

  setup                       create .venv/ (CPython 3.11 or 3.12) and install walflow with its test and bench extras
  test [PYTEST ARGS...]       setup if needed, then the whole test suite in 3 workers (each starts its own
                              PostgreSQL and NATS); -m "not slow" the quick tier, -n 0 one process
  run [CONFIG] [BYTEWAX ARGS] python -m bytewax.run dataflows.cdc with WALFLOW_CONFIG=CONFIG
                              (default config/walflow.yaml); -w, -i, -a, -r, -s, -b go to Bytewax
  backfill [CONFIG] --sink NAME --table SCHEMA.TABLE [--sort-column COL --start-position VALUE]
                              ask the running pipeline (or the next one started) to backfill a table
  check [CONFIG] [--json]     validate the config, PostgreSQL and NATS without starting the flow; each failure
                              says what to do (exit 0 all pass, 1 any fails)
  status [CONFIG] [--json]    is the pipeline healthy, and if not, why (exit 0 healthy, 1 degraded, 2 down)
  demo [--seconds N]          throwaway PostgreSQL + NATS, a demo schema, events printed live (Ctrl-C stops)
  bench [--quick] [OPTIONS]   throughput, CPU, memory, slot lag and latency against its own PostgreSQL + NATS;
                              writes bench/results/<date>.{json,md,png} (--help lists the sizes)
EOF
}

# Bytewax 0.21.1 has wheels for CPython 3.8-3.12 only, and walflow needs 3.11+.
python_ok() {
    "$1" -c 'import sys, venv; sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 12) else 1)' >/dev/null 2>&1
}

find_python() {
    local candidates=()
    [ -n "${WALFLOW_PYTHON:-}" ] && candidates+=("$WALFLOW_PYTHON")
    candidates+=(python3.12 python3.11)
    # pyenv installs versions that its shims only expose when selected: look in its tree too.
    local pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
    local p
    for p in "$pyenv_root"/versions/3.12*/bin/python3 "$pyenv_root"/versions/3.11*/bin/python3 \
             /usr/bin/python3.12 /usr/bin/python3.11 /usr/local/bin/python3.12 /usr/local/bin/python3.11; do
        [ -x "$p" ] && candidates+=("$p")
    done
    candidates+=(python3 python)
    for p in "${candidates[@]}"; do
        if command -v "$p" >/dev/null 2>&1 && python_ok "$p"; then
            command -v "$p"
            return 0
        fi
    done
    return 1
}

# PostgreSQL server binaries are a system dependency (the tests and the demo start a throwaway
# server from them). On Debian/Ubuntu as root we install them; otherwise we say how.
ensure_postgres() {
    local d
    for d in "${WALFLOW_PG_BINDIR:-}" "$(pg_config --bindir 2>/dev/null || true)" /usr/lib/postgresql/*/bin; do
        [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && return 0
    done
    command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "PostgreSQL server binaries not found; installing Debian's 'postgresql' package"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
            || die "could not install PostgreSQL; install the server (e.g. 'apt-get install postgresql') and retry"
        return 0
    fi
    say "PostgreSQL server binaries (initdb, postgres) not found."
    say "Install them (Debian/Ubuntu: 'sudo apt-get install postgresql'; macOS: 'brew install postgresql')"
    say "or set WALFLOW_PG_BINDIR to the directory that holds initdb and postgres."
    return 1
}

setup() {
    local want
    want="$(sha256sum <pyproject.toml | cut -d" " -f1)"
    if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && python_ok "$VENV/bin/python"; then
        return 0
    fi
    local py
    py="$(find_python)" || die "walflow needs CPython 3.11 or 3.12 with the venv module (Bytewax 0.21.1 has no wheels for newer Pythons).
  Install one (Debian: 'apt-get install python3.11 python3.11-venv'; pyenv: 'pyenv install 3.12')
  or point WALFLOW_PYTHON at its interpreter, then run ./run.sh setup again."
    say "setting up .venv with $("$py" --version 2>&1) ($py)"
    if [ -d "$VENV" ] && ! python_ok "$VENV/bin/python"; then
        rm -rf "$VENV"
    fi
    [ -x "$VENV/bin/python" ] || "$py" -m venv "$VENV" || die "could not create $VENV (is the venv module installed?)"
    local log="$VENV/setup.log"
    if ! { "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip \
           && "$VENV/bin/python" -m pip install --disable-pip-version-check -e ".[test,bench]"; } >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "could not install walflow and its dependencies into $VENV (full log: $log)"
    fi
    echo "$want" >"$STAMP"
    say "setup done"
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
    setup)
        setup
        ensure_postgres
        ;;
    test)
        setup
        ensure_postgres
        # Parallel workers by default, each with its own PostgreSQL and NATS (README: Tests); a -n
        # of the caller's wins (-n 0: one process, for --pdb or -s).
        workers=(-n "${WALFLOW_TEST_WORKERS:-3}")
        for arg in "$@"; do
            case "$arg" in -n | -n?* | --numprocesses | --numprocesses=* | *no:xdist) workers=() ;; esac
        done
        exec "$VENV/bin/python" -m pytest ${workers[@]+"${workers[@]}"} "$@"
        ;;
    run)
        setup
        config="config/walflow.yaml"
        if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
            config="$1"
            shift
        fi
        [ -f "$config" ] || die "config file '$config' not found (pass its path: ./run.sh run path/to/walflow.yaml)"
        export WALFLOW_CONFIG="$config"
        # walflow's defaults for Bytewax's flags: 1 s epochs (the slot is confirmed one to
        # two epochs after a change is stored), snapshots kept no longer than needed.
        export BYTEWAX_SNAPSHOT_INTERVAL="${BYTEWAX_SNAPSHOT_INTERVAL:-1}"
        export BYTEWAX_RECOVERY_BACKUP_INTERVAL="${BYTEWAX_RECOVERY_BACKUP_INTERVAL:-0}"
        exec "$VENV/bin/python" -m bytewax.run dataflows.cdc "$@"
        ;;
    demo)
        setup
        ensure_postgres
        exec "$VENV/bin/python" -m demo "$@"
        ;;
    bench)
        setup
        ensure_postgres
        exec "$VENV/bin/python" -m bench "$@"
        ;;
    backfill | check | status)
        setup
        exec "$VENV/bin/walflow" "$cmd" "$@"
        ;;
    -h | --help | help)
        usage
        ;;
    *)
        usage
        exit 2
        ;;
esac
