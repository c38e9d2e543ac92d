"""The ``MSG`` frames of walflow's direct subscriptions, read from the bytes as received.

:class:`connectors.nats.natspy.DirectParser` hands each read here first: nearly every frame
walflow receives is a JetStream ack, and this loop runs once per ack. It is compiled with the
hot path (``core/compiled.py``), which is why it lives apart from the nats-py hooks; so are
the byte readers it shares with the window's reading of an ack's sequence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("walflow.nats")

#: Called with a message's subject, payload and raw header block (None without headers).
DirectHandler = Callable[[bytes, bytes, bytes | None], None]


def is_space(byte: int) -> bool:
    """Whether ``byte`` is what a bytes pattern's ``\\s`` matches: space, ``\\t \\n \\v \\f \\r``."""
    return byte == 32 or 9 <= byte <= 13


def digits_end(data: bytes, i: int, size: int) -> int:
    """Where the run of ASCII digits at ``i`` in ``data`` ends (``i`` itself: none; ``\\d+``)."""
    while i < size and 48 <= data[i] <= 57:
        i += 1
    return i


def decimal(data: bytes, start: int, end: int) -> int:
    """The number the ASCII digits ``data[start:end]`` write."""
    value = 0
    for i in range(start, end):
        value = value * 10 + data[i] - 48
    return value


def direct_frames(data: bytes, direct: dict[int, tuple[Any, DirectHandler]]) -> tuple[int, bool]:
    r"""Hand on the direct frames at the start of ``data``: the offset after them, and whether
    what follows is a direct frame whose payload is not yet received whole.

    A direct frame's control line is ``MSG <subject> <sid> <size>`` as nats-server writes it,
    what the pattern ``MSG (\S+) (\d+) (\d+)\r\n`` matches (no reply subject), with a
    ``sid`` in ``direct``; anything else, a control line not received whole included, ends the
    run of direct frames there (nats-py's parser takes the rest, in order). Read byte by byte
    in compiled code: a regex's match, groups and two ``int`` cost more per ack than the rest
    of its handling.
    """
    size, pos = len(data), 0
    while pos + 4 <= size and data[pos] == 77 and data[pos + 1] == 83 and data[pos + 2] == 71 and data[pos + 3] == 32:
        i = pos + 4  # "MSG " read: the subject, up to a space; \S+
        while i < size and data[i] != 32 and not 9 <= data[i] <= 13:  # not is_space, inline: per subject byte
            i += 1
        subject_end = i
        if subject_end == pos + 4 or i >= size or data[i] != 32:
            break
        sid_end = digits_end(data, i + 1, size)
        if sid_end == i + 1 or sid_end >= size or data[sid_end] != 32:
            break
        length_end = digits_end(data, sid_end + 1, size)
        if length_end == sid_end + 1 or length_end + 1 >= size or data[length_end] != 13 or data[length_end + 1] != 10:
            break
        entry = direct.get(decimal(data, i + 1, sid_end))
        if entry is None:
            break
        start = length_end + 2
        end = start + decimal(data, sid_end + 1, length_end)
        if end + 2 > size:
            return pos, True
        subject = data[pos + 4 : subject_end]
        try:
            entry[1](subject, data[start:end], None)
        except Exception:  # an escape would end nats-py's read loop, silently
            log.exception("handling a message on %s failed", subject.decode(errors="replace"))
        pos = end + 2
    return pos, False
