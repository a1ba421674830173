"""Reading round reports back out of captured log records."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from fedcore.strategy.result import RoundReport


def round_reports(records: Iterable[logging.LogRecord]) -> list[RoundReport]:
    """The :class:`RoundReport` of every finished round among ``records`` (e.g. caplog's)."""
    return [
        report
        for record in records
        if isinstance(report := getattr(record, "fedcore_round", None), RoundReport)
    ]
