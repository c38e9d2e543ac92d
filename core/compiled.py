"""The hot path compiled with mypyc, the pure-Python modules kept as its reference and fallback.

Every change crosses the same few modules (decoding, type loading, ids, the exchange's wire
form, conversion, dispatch, the envelope, grouping, rendering, the publisher's window); under
one GIL their interpreter overhead is most of walflow's CPU per change (README: Performance). mypyc compiles
them from the same strictly typed sources into C extensions: no second implementation to keep
in step, and the ``.py`` files stay what the tests and a reader see (as psycopg keeps its
Python implementation beside its C one).

``./run.sh setup`` calls :func:`build` where the dev venv (mypy, hence mypyc) and a C compiler
are there; the extensions land in ``build/compiled/<digest>/``, the digest naming the exact
sources and the Python that built them. The packages that hold these modules call
:func:`extend` from their ``__init__``: when a build of the current sources exists, its
directory goes in front of the package's ``__path__`` and the extensions are imported instead
of the ``.py`` files. A source edited since the build, ``WALFLOW_PURE_PYTHON=1``, or no build
at all: the ``.py`` files, unchanged. Nothing here is imported per change.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Final

#: The modules compiled, as their sources' paths from the project root.
MODULES: Final = (
    "connectors/nats/frames.py",
    "connectors/nats/window.py",
    "connectors/postgres/decoder.py",
    "connectors/postgres/types.py",
    "core/ids.py",
    "core/metrics.py",
    "core/message.py",
    "core/wire.py",
    "transforms/columns.py",
    "transforms/conditions.py",
    "transforms/convert.py",
    "transforms/dispatch.py",
    "transforms/envelope.py",
    "transforms/filter.py",
    "transforms/group.py",
    "transforms/record.py",
    "transforms/render.py",
    "transforms/route.py",
    "transforms/shape.py",
)
#: One shared library for all of them, so calls between them stay C calls.
GROUP: Final = "walflow_hot"
#: Set to 1 to import the pure-Python modules even where a build exists.
PURE_PYTHON_VARIABLE: Final = "WALFLOW_PURE_PYTHON"

ROOT: Final = Path(__file__).resolve().parent.parent
BUILDS: Final = ROOT / "build" / "compiled"
_STAMP: Final = "BUILT"
#: The group's shared library lives apart from the packages' extensions: on ``sys.path`` it
#: must not shadow a package directory.
_LIBRARY: Final = "library"


def digest() -> str:
    """What a build is of: the compiled sources, byte for byte, and the Python that runs them."""
    h = hashlib.sha256(f"{sys.implementation.cache_tag} {sys.version}".encode())
    for module in MODULES:
        h.update(module.encode())
        h.update((ROOT / module).read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def _current() -> Path | None:
    """The build of the current sources, if there is one and it is to be used."""
    if os.environ.get(PURE_PYTHON_VARIABLE) == "1":
        return None
    target = BUILDS / digest()
    return target if (target / _STAMP).is_file() else None


def implementation() -> str:
    """``compiled`` or ``pure Python`` (and why): what this process imports for the hot path."""
    if _current() is not None:
        return "compiled"
    if os.environ.get(PURE_PYTHON_VARIABLE) == "1":
        return f"pure Python ({PURE_PYTHON_VARIABLE}=1)"
    return "pure Python (no build of these sources: ./run.sh setup builds it)"


def extend(path: list[str], package: str) -> None:
    """Put the current build's directory for ``package`` in front of its ``__path__``."""
    target = _current()
    if target is None:
        return
    library = str(target / _LIBRARY)
    if library not in sys.path:
        sys.path.append(library)
    path.insert(0, str(target.joinpath(*package.split("."))))


def build() -> str | None:
    """Compile :data:`MODULES` into ``build/compiled/<digest>/`` unless that build exists.

    Returns what was done for ``./run.sh setup`` to say, None if the build was current. Needs
    mypy (the dev venv) and a C compiler; raises whatever they raise, so setup can say why it
    fell back to pure Python.
    """
    target = BUILDS / digest()
    if (target / _STAMP).is_file():
        return None
    # Imported here: the runtime venv has neither, and only a build needs them.
    from mypyc.build import mypycify
    from setuptools import Distribution

    BUILDS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="walflow-compile-", dir=BUILDS))
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)  # mypyc names modules by their paths from here
        with contextlib.redirect_stdout(sys.stderr):  # mypyc's notes and the compiler's lines: setup's log
            extensions = mypycify(list(MODULES), opt_level="3", group_name=GROUP, target_dir=str(work / "c"))
            out = work / "out"
            distribution = Distribution({"name": GROUP, "ext_modules": extensions})
            command = distribution.get_command_obj("build_ext")
            command.build_lib = str(out)
            command.build_temp = str(work / "temp")
            distribution.run_command("build_ext")
        (out / _LIBRARY).mkdir()
        for library in out.glob(f"{GROUP}__mypyc*"):
            library.rename(out / _LIBRARY / library.name)
        (out / _STAMP).write_text(" ".join(MODULES) + "\n")
        for old in BUILDS.iterdir():  # one finished build kept, the current one (not a build under way)
            if (old / _STAMP).is_file():
                shutil.rmtree(old, ignore_errors=True)
        out.rename(target)
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    return f"compiled the hot path with mypyc ({len(MODULES)} modules, {target.relative_to(ROOT)})"
