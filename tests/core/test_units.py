"""Durations and money amounts as the CLI flags spell them."""

from __future__ import annotations

import pytest

from lightning_srifty.core.errors import ConfigError
from lightning_srifty.core.units import (
    format_hours,
    format_money,
    format_seconds,
    parse_duration,
    parse_money,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10h", 36_000.0), ("90m", 5_400.0), ("2d", 172_800.0), ("3600s", 3_600.0),
     ("1.5h", 5_400.0), (" 45 M ", 2_700.0), ("12", 43_200.0)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, flag="--deadline") == seconds


def test_bare_number_takes_the_default_unit() -> None:
    assert parse_duration("5", flag="--restart-delay", default_unit="m") == 300.0


@pytest.mark.parametrize("text", ["", "tomorrow", "10x", "-5h", "0h", "h", "1e400h", "5 hours"])
def test_bad_durations_name_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match="--deadline"):
        parse_duration(text, flag="--deadline")


MONEY = [("500", 500.0), ("$500", 500.0), ("$12.50", 12.5), (" $ 7 ", 7.0), ("$1,000", 1e3)]


@pytest.mark.parametrize(("text", "dollars"), MONEY)
def test_money(text: str, dollars: float) -> None:
    assert parse_money(text, flag="--budget") == dollars


@pytest.mark.parametrize("text", ["", "-5", "$0", "five", "500€", "$1,00", "1e3"])
def test_bad_money_names_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match="--budget"):
        parse_money(text, flag="--budget")


def test_format_hours_picks_a_readable_unit() -> None:
    assert format_hours(0.25) == "15 min"
    assert format_hours(14.24) == "14.2 h"
    assert format_hours(96.0) == "4.0 d"
    assert format_hours(float("inf")) == "never"
    assert format_hours(10 / 3600) == "10 s"


def test_format_seconds_and_money_keep_small_figures_readable() -> None:
    assert format_seconds(0.00172) == "1.72 ms"
    assert format_seconds(0.412) == "412 ms"
    assert format_seconds(12.34) == "12.3 s"
    assert format_money(1234.5) == "$1,234.50"
    assert format_money(0.000923) == "$0.000923"
    assert format_money(-0.05) == "-$0.05"
    assert format_money(0.0) == "$0.00"
    assert format_money(float("nan")) == "—"
