"""Small field readers used by every ``from_dict`` so errors quote the bad value.

A loader passes the document's source (a file path) and a dotted field path; any
mismatch raises the caller's :class:`SchemaError` subclass naming both.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Mapping
from typing import Any

from lightning_srifty.core.errors import SchemaError

_MISSING = object()


class Reader:
    """Reads typed fields from one mapping, naming ``source`` and the field on error."""

    def __init__(
        self,
        data: Any,
        *,
        source: str | None,
        path: str = "",
        error: type[SchemaError] = SchemaError,
    ):
        self.source = source
        self.path = path
        self.error = error
        if not isinstance(data, Mapping):
            raise error(
                f"expected an object, got {type(data).__name__}",
                source=source,
                field=path or "<root>",
            )
        self.data = data

    def _field(self, key: builtins.str) -> builtins.str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: builtins.str, message: builtins.str) -> SchemaError:
        """Builds (does not raise) an error for ``key``."""
        return self.error(message, source=self.source, field=self._field(key))

    def raw(self, key: builtins.str, default: Any = _MISSING) -> Any:
        if key not in self.data:
            if default is _MISSING:
                raise self.fail(key, "is missing")
            return default
        return self.data[key]

    def child(self, key: builtins.str, default: Any = _MISSING) -> Reader | None:
        value = self.raw(key, default)
        if value is None:
            return None
        return Reader(value, source=self.source, path=self._field(key), error=self.error)

    def children(self, key: builtins.str, default: Any = _MISSING) -> list[Reader]:
        value = self.raw(key, default)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list, got {type(value).__name__}")
        return [
            Reader(item, source=self.source, path=f"{self._field(key)}[{i}]", error=self.error)
            for i, item in enumerate(value)
        ]

    def str(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is None and default is None:
            return None
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {value!r}")
        return value

    def int(
        self, key: builtins.str, default: Any = _MISSING, *, minimum: builtins.int | None = None
    ) -> Any:
        value = self.raw(key, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value!r}")
        return value

    def float(
        self,
        key: builtins.str,
        default: Any = _MISSING,
        *,
        minimum: builtins.float | None = None,
        positive: builtins.bool = False,
    ) -> Any:
        value = self.raw(key, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise self.fail(key, f"must be finite, got {value!r}")
        if positive and value <= 0:
            raise self.fail(key, f"must be > 0, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value!r}")
        return value

    def bool(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def choice(
        self, key: builtins.str, options: tuple[builtins.str, ...], default: Any = _MISSING
    ) -> Any:
        value = self.str(key, default)
        if value not in options:
            raise self.fail(key, f"must be one of {', '.join(options)}; got {value!r}")
        return value

    def floats(self, key: builtins.str, default: Any = _MISSING) -> tuple[builtins.float, ...]:
        value = self.raw(key, default)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list of numbers, got {type(value).__name__}")
        out = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                raise self.fail(f"{key}[{i}]", f"expected a number, got {item!r}")
            if not math.isfinite(float(item)):
                raise self.fail(f"{key}[{i}]", f"must be finite, got {item!r}")
            out.append(float(item))
        return tuple(out)

    def ints(self, key: builtins.str, default: Any = _MISSING) -> tuple[builtins.int, ...]:
        value = self.raw(key, default)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list of integers, got {type(value).__name__}")
        out = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int):
                raise self.fail(f"{key}[{i}]", f"expected an integer, got {item!r}")
            out.append(item)
        return tuple(out)


def check_version(
    reader: Reader, supported: int, *, key: str = "schema_version", kind: str = "document"
) -> int:
    """Rejects documents written by a newer lightning-srifty with an upgrade hint."""
    version = reader.int(key, minimum=1)
    if version > supported:
        raise reader.fail(
            key,
            f"{kind} schema version {version} is newer than this lightning-srifty supports "
            f"({supported}); upgrade lightning-srifty to read it",
        )
    return int(version)
