"""Parsing human durations and money amounts given on the command line.

Flags such as ``--deadline 10h`` or ``--budget $500`` are read here so every command
accepts the same spellings and rejects bad ones with a message naming the flag.
"""

from __future__ import annotations

import math
import re

from lightning_srifty.core.errors import ConfigError

SECONDS_PER_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)
_MONEY = re.compile(r"^\s*\$?\s*(\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+)\s*$")


def parse_duration(text: str, *, flag: str = "duration", default_unit: str = "h") -> float:
    """Seconds in ``text`` such as ``10h``, ``90m``, ``2d``, ``3600s`` or ``1.5h``.

    A bare number takes ``default_unit`` (hours: deadlines are usually hours). Zero and
    negative durations are rejected because no plan can finish in them.

    Raises:
        ConfigError: naming ``flag`` and the accepted spellings.
    """
    match = _DURATION.match(text or "")
    if not match:
        raise ConfigError(
            f"{flag} {text!r} is not a duration: use a number with s, m, h or d, e.g. 10h, 90m"
        )
    value = float(match.group(1))
    unit = (match.group(2) or default_unit).lower()
    seconds = value * SECONDS_PER_UNIT[unit]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{flag} {text!r} must be a positive duration, e.g. 10h")
    return seconds


def parse_money(text: str, *, flag: str = "amount") -> float:
    """US dollars in ``text`` such as ``500``, ``$500``, ``$1,000`` or ``$12.50``.

    Raises:
        ConfigError: naming ``flag`` when the text is not a positive amount.
    """
    match = _MONEY.match(text or "")
    if not match:
        raise ConfigError(f"{flag} {text!r} is not an amount in dollars: use e.g. 500 or $500")
    value = float(match.group(1).replace(",", ""))
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{flag} {text!r} must be a positive amount in dollars")
    return value


def format_hours(hours: float) -> str:
    """``0.25`` -> ``"15 min"``, ``14.2`` -> ``"14.2 h"``, ``80`` -> ``"3.3 d"``."""
    if not math.isfinite(hours):
        return "never"
    if hours * 60 < 1.0:
        return f"{hours * 3600:.0f} s"
    if hours < 1.0:
        return f"{hours * 60:.0f} min"
    if hours < 72.0:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} d"


def format_seconds(seconds: float) -> str:
    """A step time with a unit that keeps three figures: ``"1.72 ms"``, ``"0.412 s"``."""
    if not math.isfinite(seconds):
        return "—"
    if abs(seconds) < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def format_money(usd: float) -> str:
    """Dollars with cents, or three significant figures below a dollar (tiny jobs)."""
    if not math.isfinite(usd):
        return "—"
    sign = "-" if usd < 0 else ""
    amount = abs(usd)
    if amount >= 1.0 or amount == 0.0:
        return f"{sign}${amount:,.2f}"
    return f"{sign}${amount:.3g}"
