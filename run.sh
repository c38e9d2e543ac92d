#!/usr/bin/env bash
# walflow's one entry point: setup, test, run (and demo). See README.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
# Two venvs, each exactly one lock (requirements/, README: Setup): .venv for the tests, the demo and
# the benchmark (runtime + test + bench), .venv-runtime for run, check, status and backfill (runtime only).
VENV="$ROOT/.venv"
RUNTIME_VENV="$ROOT/.venv-runtime"
LOCKS="$ROOT/requirements"

say() { printf 'walflow: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

usage() {
    cat >&2 <<'EOF'
usage: ./run.sh COMMAND [ARGS...]

  setup [runtime]             install the locked, hash-checked packages (CPython 3.11 or 3.12): .venv-runtime/
                              from requirements/runtime.lock and .venv/ from requirements/dev.lock
                              ("runtime": .venv-runtime/ only, for a host that only runs walflow)
  test [PYTEST ARGS...]       setup if needed, then the whole test suite in 3 workers (each starts its own
                              PostgreSQL and NATS); -m "not slow" the quick tier, -n 0 one process
  run [CONFIG] [BYTEWAX ARGS] python -m bytewax.run dataflows.cdc with WALFLOW_CONFIG=CONFIG
                              (default config/walflow.yaml); -w, -i, -a, -r, -s, -b go to Bytewax.
                              run, backfill, check and status use .venv-runtime/ and never download:
                              without a current one they stop and ask for ./run.sh setup
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

# PostgreSQL server binaries are a system dependency of the tests, the demo and the benchmark (each
# starts a throwaway server from them); running walflow needs none. On Debian/Ubuntu as root we
# install them, saying so first, without the system cluster the package would otherwise create and
# start on :5432; otherwise we say how. $1 says what needs them ("the tests").
ensure_postgres() {
    local d
    for d in "${WALFLOW_PG_BINDIR:-}" "$(pg_config --bindir 2>/dev/null || true)" /usr/lib/postgresql/*/bin; do
        [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && return 0
    done
    command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq || die "apt-get update failed; install PostgreSQL's server binaries and retry"
        # The distribution's server package (postgresql-15 on Debian bookworm), not the 'postgresql'
        # metapackage and its recommends.
        local pkg
        pkg="$(apt-cache depends postgresql 2>/dev/null | sed -n 's/^ *Depends: \(postgresql-[0-9][0-9]*\)$/\1/p' | head -n 1)"
        pkg="${pkg:-postgresql}"
        say "PostgreSQL server binaries not found; installing Debian's $pkg server binaries for $1 (apt-get;"
        say "no cluster is created or started: /etc/postgresql-common/createcluster.d/walflow.conf)"
        mkdir -p /etc/postgresql-common/createcluster.d
        echo "create_main_cluster = false  # walflow's run.sh: its tests start their own servers" \
            >/etc/postgresql-common/createcluster.d/walflow.conf
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null \
            || die "could not install $pkg; install PostgreSQL's server binaries and retry"
        return 0
    fi
    say "PostgreSQL server binaries (initdb, postgres) not found; $1 need them."
    say "Install them (Debian/Ubuntu: 'sudo apt-get install postgresql-15', which also creates and starts a"
    say "system cluster unless /etc/postgresql-common/createcluster.d/ says 'create_main_cluster = false';"
    say "macOS: 'brew install postgresql') or set WALFLOW_PG_BINDIR to the directory that holds initdb and postgres."
    return 1
}

# What a venv was installed from: its lock, the build lock and pyproject.toml (walflow itself).
venv_digest() {
    cat "$LOCKS/build.lock" "$LOCKS/$1" pyproject.toml | sha256sum | cut -d" " -f1
}

# VENV LOCK: is VENV a CPython 3.11/3.12 venv installed from exactly LOCK as it is now?
venv_current() {
    [ -x "$1/bin/python" ] && python_ok "$1/bin/python" && [ -f "$1/.walflow-setup" ] \
        && [ "$(cat "$1/.walflow-setup")" = "$(venv_digest "$2")" ]
}

# VENV LOCK: (re)create VENV holding exactly LOCK's pins and walflow, every file checked against
# the lock's sha256. Nothing else is downloaded: not pip itself (the venv's own is used), not a
# build backend (setuptools comes from build.lock, builds run with --no-build-isolation).
install_venv() {
    local venv="$1" lock="$2"
    venv_current "$venv" "$lock" && return 0
    local py
    py="$(find_python)" || die "walflow needs CPython 3.11 or 3.12 with the venv module (Bytewax 0.21.1 has no wheels for newer Pythons).
  Install one (Debian: 'apt-get install python3.11 python3.11-venv'; pyenv: 'pyenv install 3.12')
  or point WALFLOW_PYTHON at its interpreter, then run ./run.sh setup again."
    say "installing requirements/$lock into ${venv#"$ROOT/"}/ with $("$py" --version 2>&1) ($py)"
    # A fresh venv each time: packages a previous lock had and this one drops must not stay.
    rm -rf "$venv"
    "$py" -m venv "$venv" || die "could not create $venv (is the venv module installed?)"
    local log="$venv/setup.log" pip=("$venv/bin/python" -m pip install --disable-pip-version-check --no-deps)
    if ! { "${pip[@]}" --require-hashes -r "$LOCKS/build.lock" \
           && "${pip[@]}" --require-hashes --no-build-isolation -r "$LOCKS/$lock" \
           && "${pip[@]}" --no-build-isolation -e .; } >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "could not install requirements/$lock into $venv (full log: $log)"
    fi
    venv_digest "$lock" >"$venv/.walflow-setup"
}

setup_runtime() { install_venv "$RUNTIME_VENV" runtime.lock; }
setup_dev() { install_venv "$VENV" dev.lock; setup_compiled; }

# The hot path compiled with mypyc (from .venv/) where a C compiler exists, into build/compiled/
# (core/compiled.py; README: Performance); both venvs import it. Without a compiler, or if the
# build fails, the same modules run as pure Python: slower, never different. Quiet when current.
setup_compiled() {
    if ! command -v "${CC:-cc}" >/dev/null 2>&1; then
        say "no C compiler (${CC:-cc}): the hot path runs as pure Python (install gcc, then ./run.sh setup compiles it)"
        return 0
    fi
    local log="$ROOT/build/compile.log" done
    mkdir -p "$ROOT/build"
    if ! done="$("$VENV/bin/python" -c 'from core.compiled import build; print(build() or "")' 2>"$log")"; then
        tail -n 20 "$log" >&2
        say "compiling the hot path failed (full log: build/compile.log); it runs as pure Python"
        return 0
    fi
    [ -z "$done" ] || say "$done"
}

# run, backfill, check and status never download: a runtime venv that is missing or older than
# the locks (or pyproject.toml) stops them with what to do.
need_runtime() {
    venv_current "$RUNTIME_VENV" runtime.lock && return 0
    if [ -x "$RUNTIME_VENV/bin/python" ]; then
        die ".venv-runtime/ is out of date with requirements/runtime.lock or pyproject.toml; run ./run.sh setup (it downloads; $1 never does)"
    fi
    die ".venv-runtime/ is not set up; run ./run.sh setup first (it downloads the locked packages; $1 never does)"
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
    setup)
        case "${1:-}" in
            "") setup_runtime; setup_dev ;;
            runtime) setup_runtime ;;
            *) usage; exit 2 ;;
        esac
        ;;
    test)
        # both venvs: tests/test_install.py checks each against its lock
        setup_runtime
        setup_dev
        ensure_postgres "the tests"
        # Parallel workers by default, each with its own PostgreSQL and NATS (README: Tests); a -n
        # of the caller's wins (-n 0: one process, for --pdb or -s).
        workers=(-n "${WALFLOW_TEST_WORKERS:-3}")
        for arg in "$@"; do
            case "$arg" in -n | -n?* | --numprocesses | --numprocesses=* | *no:xdist) workers=() ;; esac
        done
        exec "$VENV/bin/python" -m pytest ${workers[@]+"${workers[@]}"} "$@"
        ;;
    run)
        need_runtime "./run.sh run"
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
        exec "$RUNTIME_VENV/bin/python" -m bytewax.run dataflows.cdc "$@"
        ;;
    demo)
        setup_dev
        ensure_postgres "the demo"
        exec "$VENV/bin/python" -m demo "$@"
        ;;
    bench)
        setup_dev
        ensure_postgres "the benchmark"
        exec "$VENV/bin/python" -m bench "$@"
        ;;
    backfill | check | status)
        need_runtime "./run.sh $cmd"
        exec "$RUNTIME_VENV/bin/walflow" "$cmd" "$@"
        ;;
    -h | --help | help)
        usage
        ;;
    *)
        usage
        exit 2
        ;;
esac
