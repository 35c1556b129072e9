"""python-tuf's own ngclient, used as an independent reference client."""

from __future__ import annotations

from pathlib import Path

from tuf.ngclient import Updater


def reference_updater(client_dir: Path, base_url: str, root_bytes: bytes) -> Updater:
    """An ``Updater`` that trusts ``root_bytes`` and reads ``base_url``'s tree."""
    meta = client_dir / "metadata"
    meta.mkdir(parents=True, exist_ok=True)
    (client_dir / "targets").mkdir(exist_ok=True)
    return Updater(
        metadata_dir=str(meta),
        metadata_base_url=f"{base_url}metadata/",
        target_base_url=base_url,
        target_dir=str(client_dir / "targets"),
        bootstrap=root_bytes,
    )
