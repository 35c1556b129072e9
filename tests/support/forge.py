"""An attacker holding a leaked online key: forge a timestamp, snapshot and one bin over a gateway's tree.

Run as ``python -m tests.support.forge PUBLIC KEY_URI PROJECT OUT``: reads the
signed tree in PUBLIC, adds a file ``PROJECT-6.6.6-py3-none-any.whl`` to
PROJECT's signed page, signs the bin that holds the page, a snapshot and a
timestamp with the key KEY_URI names (each version 10**15 above the real one:
a fast-forward, which edges must recover from once the key is rotated),
and writes those files and the forged pages to OUT at the paths the tree
serves them under.  A subprocess, so its PKCS#11 module reads the test's
``SOFTHSM2_CONF`` afresh.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from tuf.api.metadata import Metadata, MetaFile, TargetFile
from tuf.api.serialization.json import JSONSerializer

from proxy.protocol import index
from proxy.protocol.layout import PageFormat
from proxy.protocol.profiles import get_profile
from proxy.repository.keysource import import_key, open_signer

FORGED_VERSION = "6.6.6"


def forge(public: Path, uri: str, project: str, out: Path) -> None:
    profile = get_profile("gateway")
    meta = public / "metadata"
    serializer = JSONSerializer(compact=True)
    signer = open_signer(uri, import_key(uri)[1])
    timestamp = Metadata.from_bytes((meta / "timestamp.json").read_bytes())
    snapshot = Metadata.from_bytes((meta / f"{timestamp.signed.snapshot_meta.version}.snapshot.json").read_bytes())
    bins = Metadata.from_bytes((meta / f"{snapshot.signed.meta['bins.json'].version}.bins.json").read_bytes())
    assert bins.signed.delegations is not None and bins.signed.delegations.succinct_roles is not None
    page = index.parse_project_json((public / "simple" / project / "index.json").read_bytes(), project)
    evil = dataclasses.replace(page.files[0], filename=f"{project}-{FORGED_VERSION}-py3-none-any.whl",
                               url=f"../../packages/{project}/{project}-{FORGED_VERSION}-py3-none-any.whl",
                               hashes={"sha256": "6" * 64})
    page = dataclasses.replace(page, files=(*page.files, evil), versions=(*page.versions, FORGED_VERSION))
    files: dict[str, bytes] = {}
    bin_md = None
    for fmt in profile.signed_formats:
        target = profile.page_target(project, fmt)
        body = index.render_project_json(page) if fmt is PageFormat.JSON else index.render_project_html(page)
        name = bins.signed.delegations.succinct_roles.get_role_for_target(target)
        if bin_md is None:
            bin_md = Metadata.from_bytes((meta / f"{snapshot.signed.meta[f'{name}.json'].version}.{name}.json").read_bytes())
            bin_name = name
        info = TargetFile.from_data(target, body, list(profile.hash_algorithms))
        bin_md.signed.targets[target] = info
        for digest in info.hashes.values():
            files[profile.served_name(target, digest)] = body
    assert bin_md is not None
    for md in (bin_md, snapshot, timestamp):
        md.signed.version += 10**15  # a fast-forward: far above anything the gateway will sign
        md.signatures.clear()
    snapshot.signed.meta[f"{bin_name}.json"] = MetaFile(version=bin_md.signed.version)
    timestamp.signed.snapshot_meta = MetaFile(version=snapshot.signed.version)
    for md in (bin_md, snapshot, timestamp):
        md.sign(signer)
    prefix = profile.metadata_path
    files[f"{prefix}/{bin_md.signed.version}.{bin_name}.json"] = bin_md.to_bytes(serializer)
    files[f"{prefix}/{snapshot.signed.version}.snapshot.json"] = snapshot.to_bytes(serializer)
    files[f"{prefix}/timestamp.json"] = timestamp.to_bytes(serializer)
    for path, body in files.items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_bytes(body)


if __name__ == "__main__":
    forge(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))
