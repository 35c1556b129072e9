"""Which layout an upstream has, read from the metadata a trusted client verified (no layout flag needed).

:func:`open_detected` opens a :class:`~proxy.trust.TrustedClient` where the
metadata is (``metadata/``, else ``tuf-metadata/``, the warehouse draft's),
refreshes it, and reads the layout from its verified top-level targets
(:func:`proxy.protocol.profiles.detect_profile`).  An insisted layout
(``--profile``) is kept when the metadata allows it, and refused in one line
naming both when it does not.  With nothing verified yet (the upstream does
not answer and nothing was trusted before), the layout is assumed: the
insisted one, else ``tufproxy``, and said so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from proxy.protocol.errors import TrustError
from proxy.protocol.profiles import TUFPROXY, WAREHOUSE, Profile, choose_profile, detect_profile
from proxy.trust.client import TrustedClient

# Opens a trusted client whose mirrors read metadata at this path, for a layout of this guess (target URLs).
OpenAt = Callable[[str, Profile], Awaitable[TrustedClient]]


@dataclass
class Detected:
    """The client to use, its layout, and how that was decided."""

    client: TrustedClient
    profile: Profile
    how: str  # "detected from the signed metadata", "given", or "assumed: ..."
    error: TrustError | None = None  # why nothing verified (the initial refresh's failure), if so
    verified: bool = True  # False: nothing verified yet, the layout is the insisted or assumed one

    def describe(self) -> str:
        return f"layout {self.profile.name} ({self.how})"


def candidate_paths(metadata_path: str | None, insisted: Profile | None) -> list[str]:
    """Where to look for metadata: the given path, else the insisted layout's first, then each known layout's
    (metadata found elsewhere than an insisted layout keeps it is a contradiction to report, not a 404)."""
    if metadata_path is not None:
        return [metadata_path]
    first = [insisted.metadata_path] if insisted is not None else []
    return list(dict.fromkeys((*first, TUFPROXY.metadata_path, WAREHOUSE.metadata_path)))


def _guess(path: str, insisted: Profile | None) -> Profile:
    return insisted or (WAREHOUSE if path == WAREHOUSE.metadata_path else TUFPROXY)


async def open_detected(open_at: OpenAt, paths: Sequence[str], insisted: Profile | None,
                        source: str = "--profile") -> Detected:
    """A refreshed client and the layout of what it verified; see the module docstring.

    Raises :class:`~proxy.protocol.profiles.LayoutError` when ``insisted`` contradicts the metadata.
    """
    first: tuple[TrustedClient, Profile, TrustError | None] | None = None
    for path in paths:
        guess = _guess(path, insisted)
        client = await open_at(path, guess)
        try:
            await client.refresh(force=True)
            error = None
        except TrustError as e:
            error = e
        targets = client.verified_targets
        if targets is None:  # nothing verified here, now or before
            if first is None:
                first = (client, guess, error)  # kept: what it failed with is what /readyz reports
            else:
                client.close()
            continue
        if first is not None:
            first[0].close()
        try:
            profile = choose_profile(detect_profile(targets), insisted, source)
        except BaseException:
            client.close()
            raise
        if profile.served_name is not guess.served_name:
            client.close()  # reopened on what it just verified and kept: no new fetch
            client = await open_at(path, profile)
        how = "given" if insisted is not None else "detected from the signed metadata"
        return Detected(client, profile, how, error)
    assert first is not None  # paths is never empty
    client, profile, error = first
    why = "given" if insisted is not None else "assumed until the metadata verifies: restart to detect it"
    return Detected(client, profile, why, error, verified=False)
