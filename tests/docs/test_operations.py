"""docs/operations.md: a section per failure mode, each saying the four things, naming only real metrics."""

from __future__ import annotations

import re

import pytest

from tests.docs.metrics import METRICS
from tests.pipeline import ROOT

GUIDE = ROOT / "docs" / "operations.md"

#: The failure modes of the liveness work (README: "Faults", "Known limits"), as the guide's headings.
FAILURE_MODES = [
    "Postgres restarted", "Walsender killed", "Network partition", "Slot held by another PID (55006)",
    "Slot invalidated (`wal_status` lost)", "NATS down, slow, or refusing permissions", "WAL growth (slot lag)",
    "Disk full", "Long transactions", "Idle database", "Filtered tables", "Backfills stuck",
    "Memory bound reached / backpressure", "Config errors", "A logical message walflow ignored",
]


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.fixture(scope="module")
def text() -> str:
    return GUIDE.read_text(encoding="utf-8")


def test_a_section_per_failure_mode_with_symptom_action_advice_and_signals(text: str) -> None:
    sections = _sections(text)
    for mode in FAILURE_MODES:
        assert mode in sections, f"no section '## {mode}'"
        body = sections[mode]
        if mode.startswith("NATS"):  # three kinds of trouble, a subsection each
            assert body.count("**Symptom.**") >= 3, mode
        for part in ("**Symptom.**", "**What walflow does.**", "**What you may do.**", "**Where it shows.**"):
            assert part in body, f"{mode}: no {part}"
        signals = body.split("**Where it shows.**")[-1]
        assert "walflow_" in signals or "`walflow status`" in signals, f"{mode}: no metric nor status line"


def test_it_names_only_metrics_walflow_serves(text: str) -> None:
    for name in re.findall(r"\bwalflow_\w+(?!\w|\*)", text):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in METRICS or METRICS.get(base) == "histogram", f"{name} is not a metric walflow serves"


def test_its_links_within_the_page_lead_somewhere(text: str) -> None:
    anchors = {_anchor(heading) for heading in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in anchors, f"#{target} is no heading of {GUIDE.name}"
    for page in re.findall(r"\]\(([\w.-]+\.(?:md|json))\)", text):
        assert (GUIDE.parent / page).exists(), page
