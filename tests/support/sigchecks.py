"""Which roles python-tuf checks a signature threshold for, counted where it does it (``Root.verify_delegate``)."""

from __future__ import annotations

import pytest
from tuf.api.metadata import Root


def count_signature_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that gets each role name python-tuf checks signatures for, in order, for the rest of the test."""
    seen: list[str] = []
    original = Root.verify_delegate

    def counting(self: Root, role: str, *args: object) -> None:
        seen.append(role)
        original(self, role, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Root, "verify_delegate", counting)
    return seen
