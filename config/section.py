"""The base of every config model (``config/schema.py``, ``config/shaping.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base for every config model: strict about keys, immutable once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=False)

    #: Sequin keys accepted and dropped with a warning: key -> why walflow does not use it.
    ignored: ClassVar[Mapping[str, str]] = {}
    #: Sequin values run as another value, with a warning: key -> {Sequin's value: (walflow's, why)}.
    replaced: ClassVar[Mapping[str, Mapping[str, tuple[str, str]]]] = {}
    #: None: an unknown key is an error; else unknown keys are dropped with this reason.
    unknown_keys: ClassVar[str | None] = None
    #: The key that tells this model from the others a key may hold (``subject`` for
    #: ``routing: {subject: …}`` beside ``routing: {python: …}``): the reference titles its
    #: section "`routing` (`subject:` form)". None: the only model of its key.
    form: ClassVar[str | None] = None
    #: A field mapping names to sections (``mask``) -> what the names are (``column``): the
    #: reference's path of such a section is ``mask.<column>``.
    keyed_by: ClassVar[Mapping[str, str]] = {}
