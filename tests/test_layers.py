"""The packages' layers, from their imports: what each may use, and no cycle between them.

``core`` is shared by all and uses none; ``config`` uses ``core``; the two connectors never
import each other or ``transforms``; ``transforms`` may use the Postgres connector's types
(the values it converts are Postgres's texts, loaded as the catalog says; enrichment queries
the database) but never the NATS one. The flow (``dataflows``) wires them; the commands and
tools above use anything. A package that reaches up or sideways makes one change's path
cross a layer back and forth.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What each package may import, besides itself.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "config": {"core"},
    "connectors.postgres": {"core", "config"},
    "connectors.nats": {"core", "config"},
    "transforms": {"core", "config", "connectors.postgres"},
}
_PACKAGES = ("core", "config", "connectors", "transforms", "dataflows", "cli", "embedded", "demo", "bench")


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] not in _PACKAGES:
        return None
    return ".".join(parts[:2]) if parts[0] == "connectors" and len(parts) > 1 else parts[0]


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_each_package_imports_only_the_layers_below_it() -> None:
    wrong: list[str] = []
    for layer, allowed in ALLOWED.items():
        for path in sorted((ROOT / layer.replace(".", "/")).rglob("*.py")):
            for module in sorted(_imports(path)):
                target = _layer(module)
                if target is not None and target != layer and target not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports {module} ({layer} may use {sorted(allowed)})")
    assert not wrong, "\n".join(wrong)
