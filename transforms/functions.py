"""Python callables named in the config (``python: module:function``), imported once at startup.

The module is looked up on Python's path and in the config file's directory, as Sequin looks
up a function's ``file:`` beside the YAML: a user keeps ``shaping.py`` next to
``walflow.yaml``. Every process of a cluster loads the config and imports the same modules.
An import that fails, or a name that is not callable, is a :class:`core.errors.FatalError`
naming the key: found at startup, not at the first change.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.errors import FatalError

#: What a config's callable is called with: Sequin's ``(action, record, changes, metadata)``.
Function = Callable[[str, dict[str, Any], dict[str, Any] | None, dict[str, Any]], Any]


def load_function(path: str, key: str, beside: Path | None = None) -> Function:
    """The callable ``path`` (``module:function``, an attribute path after the colon) names;
    ``key`` is the config key that names it, for the error; ``beside``: the config's directory."""
    module_name, _, attribute = path.partition(":")
    if beside is not None and str(beside) not in sys.path:
        sys.path.append(str(beside))
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:  # any error the module raises while importing is the user's to see
        where = f" (looked on Python's path and in {beside})" if beside is not None else ""
        raise FatalError(f"{key}: cannot import module '{module_name}' of {path}{where}: "
                         f"{type(exc).__name__}: {exc}") from exc
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise FatalError(f"{key}: module '{module_name}' has no '{attribute}' (from {path})") from None
    if not callable(found):
        raise FatalError(f"{key}: {path} is a {type(found).__name__}, not a function")
    function: Function = found
    return function
