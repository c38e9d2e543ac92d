"""The base of every config model (``config/schema.py``, ``config/shaping.py``).

Errors never repeat a model's inputs (``hide_input_in_errors``): a value may be a secret.
The loader shows what was given where the key holds none (``config/loader.py``); a key
holds one when its type is ``SecretStr``, when its field is ``repr=False`` (a URL that may
carry a password), or when the model lists it in ``secret_keys``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base for every config model: strict about keys, immutable once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

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
    #: Keys that are no field, read before validation, whose values may hold a secret (a
    #: database's ``url``, with its password): errors never repeat them.
    secret_keys: ClassVar[frozenset[str]] = frozenset()
