#!/usr/bin/env bash
# Regenerates the lock files from pyproject.toml and build.in with uv (https://docs.astral.sh/uv/;
# `pip install uv` anywhere: it is not a dependency of walflow, its setup or its tests).
# Pins already in a lock are kept; `requirements/compile.sh --upgrade` moves them to the newest
# releases the ranges allow. Every lock is universal (markers, not one platform) with the
# sha256 of every published file of each pinned version: CPython 3.11 and 3.12 on Linux
# x86_64 and aarch64 all install from it.
set -euo pipefail
cd "$(dirname "$0")/.."
export UV_CUSTOM_COMPILE_COMMAND="requirements/compile.sh"
compile() { "${UV:-uv}" pip compile --quiet --universal --python-version 3.11 --generate-hashes "$@"; }
compile requirements/build.in -o requirements/build.lock "$@"
compile pyproject.toml -o requirements/runtime.lock "$@"
compile pyproject.toml --extra test --extra bench -c requirements/runtime.lock -o requirements/dev.lock "$@"
