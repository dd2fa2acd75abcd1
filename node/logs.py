"""Logs on stderr: readable lines on a terminal, JSON lines otherwise (for collectors), level from config or flag."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonLines(logging.Formatter):
    """One JSON object per record: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, form: str) -> None:
    """Send every log record to stderr at `level`, as text ("text"), JSON ("json") or by terminal ("auto")."""
    handler = logging.StreamHandler(sys.stderr)
    if form == "json" or (form == "auto" and not sys.stderr.isatty()):
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
