"""The offline root ceremony: draft root N+1 (and new targets/bins versions), sign it key by key, publish it.

A draft is one JSON file, everything a key holder needs on a machine with no
gateway and no network::

    {"tufproxy_draft": 1,
     "trusted": {"root": <root N>, "targets": <current targets>},   what the draft changes, as signed now
     "roles": {"root": <root N+1>, "targets"?: ..., "bins"?: ...},  unsigned at first
     "keys": {"online"?: {"uri", "keyid", "public_key"}, ...}}     keys by URI the gateway signs with after

:func:`draft` writes the next root (keys added or removed, a new threshold, a
new online key) and, when the online, targets or bins key changes, the
delegating metadata that must name it (bins delegates every bin-n to the online
key; targets delegates to bins), each with its version raised.  :func:`sign`
adds one key's signature to every role of the draft that key may sign (root: a
key of root N or N+1; targets: N+1's targets key; bins: targets' bins key);
signing again with the same key changes nothing.  :func:`status` says who signed
and what is missing, computed by tuf's own threshold check
(``get_verification_result``).  :func:`verify` is what ``publish`` checks
before :meth:`Repository.publish_signed`: the TUF client workflow's (version
N+1, root N's threshold and root N+1's own, then each delegation's).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import load_pem_public_key
from securesystemslib.signer import Key, Signer, SSlibKey
from tuf.api.metadata import Metadata, Root, Targets

from proxy.protocol.keyuri import printable, storable
from proxy.repository.keys import BINS, ONLINE, TARGETS
from proxy.repository.keysource import KeyUnavailable, import_key, open_signer
from proxy.repository.signer import BINS_ROLE, Repository, RepositoryError

FORMAT = 1


class CeremonyError(RepositoryError):
    """A draft that cannot be made, signed or published as asked; one line."""


class Draft:
    """A draft file's contents."""

    def __init__(self, data: dict[str, Any]) -> None:
        if data.get("tufproxy_draft") != FORMAT:
            raise CeremonyError("not a tufproxy root draft (no 'tufproxy_draft': 1)")
        try:
            self.trusted_root: Metadata[Root] = Metadata.from_dict(copy.deepcopy(data["trusted"]["root"]))
            self.trusted_targets: Metadata[Targets] = Metadata.from_dict(copy.deepcopy(data["trusted"]["targets"]))
            self.roles: dict[str, Metadata] = {name: Metadata.from_dict(copy.deepcopy(md)) for name, md in data["roles"].items()}
            self.keys: dict[str, dict[str, Any]] = dict(data.get("keys", {}))
        except (KeyError, TypeError, ValueError) as e:
            raise CeremonyError(f"the draft is damaged: {e}") from None
        if "root" not in self.roles:
            raise CeremonyError("the draft has no root")

    @classmethod
    def read(cls, path: Path) -> Draft:
        try:
            return cls(json.loads(Path(path).read_bytes()))
        except OSError as e:
            raise CeremonyError(f"cannot read {path}: {e.strerror}") from None
        except ValueError as e:
            raise CeremonyError(f"{path} is not JSON: {e}") from None

    def to_bytes(self) -> bytes:
        return json.dumps({
            "tufproxy_draft": FORMAT,
            "trusted": {"root": self.trusted_root.to_dict(), "targets": self.trusted_targets.to_dict()},
            "roles": {name: md.to_dict() for name, md in self.roles.items()},
            "keys": self.keys,
        }, indent=1, sort_keys=True).encode() + b"\n"

    @property
    def root(self) -> Metadata[Root]:
        return self.roles["root"]

    def delegators(self, name: str) -> list[tuple[str, Root | Targets]]:
        """Who must approve role ``name`` of the draft, each with a threshold: (what to call it, the delegator)."""
        if name == "root":
            return [(f"root v{self.trusted_root.signed.version}", self.trusted_root.signed),
                    (f"root v{self.root.signed.version}", self.root.signed)]
        if name == TARGETS:
            return [(f"root v{self.root.signed.version}", self.root.signed)]
        targets = self.roles.get(TARGETS, self.trusted_targets)
        return [(f"targets v{targets.signed.version}", targets.signed)]


def _public_key(spec: str) -> tuple[str | None, Key]:
    """A key URI (its public key read from the token/KMS), or a PEM public key file (no URI)."""
    path = Path(spec)
    if path.is_file():
        try:
            return None, SSlibKey.from_crypto(load_pem_public_key(path.read_bytes()))
        except Exception as e:  # noqa: BLE001 - cryptography's and securesystemslib's parse errors
            raise CeremonyError(f"{path}: not a PEM public key ({e})") from None
    return import_key(spec)


def _bump(md: Metadata, now: datetime, lifetime: timedelta, clock: bool) -> None:
    floor = int(time.time() * 1000) if clock else 0
    md.signed.version = max(md.signed.version + 1, floor)
    md.signed.expires = now + lifetime
    md.signatures.clear()


def draft(repo: Repository, *, add_root_keys: Sequence[str] = (), remove_root_keys: Sequence[str] = (),
          root_threshold: int | None = None, online_key: str | None = None, targets_key: str | None = None,
          bins_key: str | None = None, expires: timedelta | None = None, now: datetime | None = None) -> Draft:
    """The next root of ``repo`` (and the metadata a key change needs), unsigned."""
    when = (now or datetime.now(UTC)).replace(microsecond=0)
    trusted_root = repo._load("root", repo.root_version())
    snapshot = repo._load("snapshot", repo._load("timestamp").signed.snapshot_meta.version)
    trusted_targets = repo._load(TARGETS, snapshot.signed.meta["targets.json"].version)
    root_md: Metadata[Root] = Metadata.from_dict(copy.deepcopy(trusted_root.to_dict()))
    root = root_md.signed
    _bump(root_md, when, expires or repo.settings.expiry.root, False)
    for keyid in remove_root_keys:
        matches = [k for k in root.roles["root"].keyids if k.startswith(keyid)]
        if len(matches) != 1:
            raise CeremonyError(f"--remove-root-key {keyid}: {'no' if not matches else 'more than one'} root key has that keyid")
        root.revoke_key(matches[0], "root")
    keys: dict[str, dict[str, Any]] = {}
    for spec in add_root_keys:
        _, public = _public_key(spec)
        if public.keyid in root.roles["root"].keyids:
            raise CeremonyError(f"{printable(spec)} is already a root key")
        root.add_key(public, "root")
    count = len(root.roles["root"].keyids)
    threshold = root_threshold or root.roles["root"].threshold
    if not 1 <= threshold <= count:
        raise CeremonyError(f"root threshold {threshold} needs 1..{count} root keys")
    root.roles["root"].threshold = threshold

    roles: dict[str, Metadata] = {"root": root_md}
    clock = repo.settings.clock_versions
    delegator = repo.profile.bin_delegator

    def role(name: str) -> Metadata:
        if name not in roles:
            current = repo._load(name, snapshot.signed.meta[f"{name}.json"].version)
            _bump(current, when, repo.settings.expiry.for_role(name), clock)
            roles[name] = current
        return roles[name]

    def adopt(name: str, uri: str) -> Key:
        _, public = import_key(uri)
        keys[name] = {"uri": storable(uri), "keyid": public.keyid, "public_key": public.to_dict()}
        return public

    if online_key is not None:
        new = adopt(ONLINE, online_key)
        for top in ("timestamp", "snapshot"):
            for old in list(root.roles[top].keyids):
                root.revoke_key(old, top)
            root.add_key(new, top)
        delegations = role(delegator).signed.delegations
        assert delegations is not None and delegations.succinct_roles is not None
        delegations.keys = {new.keyid: new}
        delegations.succinct_roles.keyids = [new.keyid]
    if targets_key is not None:
        new = adopt(TARGETS, targets_key)
        for old in list(root.roles[TARGETS].keyids):
            root.revoke_key(old, TARGETS)
        root.add_key(new, TARGETS)
        role(TARGETS)  # signed again, by the new key
    if bins_key is not None:
        if delegator != BINS_ROLE:
            raise CeremonyError(f"the {repo.profile.name} layout has no bins role")
        new = adopt(BINS, bins_key)
        delegations = role(TARGETS).signed.delegations
        assert delegations is not None and delegations.roles is not None
        for old in delegations.roles[BINS_ROLE].keyids:
            delegations.keys.pop(old, None)
        delegations.keys[new.keyid] = new
        delegations.roles[BINS_ROLE].keyids = [new.keyid]
        role(BINS_ROLE)
    return Draft({"tufproxy_draft": FORMAT, "trusted": {"root": trusted_root.to_dict(), "targets": trusted_targets.to_dict()},
                  "roles": {name: md.to_dict() for name, md in roles.items()}, "keys": keys})


def _may_sign(d: Draft, name: str, keyid: str) -> bool:
    for _, delegator in d.delegators(name):
        if isinstance(delegator, Root):
            if keyid in delegator.roles[name].keyids:
                return True
        else:
            assert delegator.delegations is not None and delegator.delegations.roles is not None
            if keyid in delegator.delegations.roles[name].keyids:
                return True
    return False


def sign(d: Draft, uri: str) -> list[str]:
    """Sign every role of ``d`` the key ``uri`` may sign and has not signed yet; the roles signed now."""
    _, public = import_key(uri)
    roles = [name for name in d.roles if _may_sign(d, name, public.keyid)]
    if not roles:
        raise CeremonyError(f"{printable(uri)} (keyid {public.keyid[:16]}) signs no role of this draft")
    todo = [name for name in roles if public.keyid not in d.roles[name].signatures]
    if todo:
        signer: Signer = open_signer(uri, public)
        for name in todo:
            try:
                d.roles[name].sign(signer, append=True)
            except Exception as e:  # noqa: BLE001 - tuf wraps whatever the signer raised
                raise KeyUnavailable(str(e.__cause__ or e)) from None
    return todo


def status(d: Draft) -> list[dict[str, Any]]:
    """Per role and approving delegator: threshold, who signed, how many are missing."""
    rows = []
    for name, md in d.roles.items():
        for who, delegator in d.delegators(name):
            result = delegator.get_verification_result(name, md.signed_bytes, md.signatures)
            rows.append({"role": name, "version": md.signed.version, "by": who, "threshold": result.threshold,
                         "signed": sorted(result.signed), "missing": max(0, result.threshold - len(result.signed)),
                         "unsigned": sorted(result.unsigned)})
    return rows


def verify(d: Draft, repo: Repository, now: datetime | None = None) -> None:
    """What ``publish`` checks, as a TUF client would; CeremonyError says what is missing."""
    when = now or datetime.now(UTC)
    current = repo._load("root", repo.root_version())
    if current.signed_bytes != d.trusted_root.signed_bytes:
        raise CeremonyError(f"the draft was made from root v{d.trusted_root.signed.version}; {repo.path} is at "
                            f"root v{current.signed.version}: draft again")
    if d.root.signed.version != current.signed.version + 1:
        raise CeremonyError(f"the draft is root v{d.root.signed.version}, not v{current.signed.version + 1}")
    if d.root.signed.type != Root.type or any(md.signed.type != Targets.type for n, md in d.roles.items() if n != "root"):
        raise CeremonyError("the draft holds metadata of the wrong type")
    missing = [f"{r['role']} needs {r['missing']} more signature(s) under {r['by']} (threshold {r['threshold']})"
               for r in status(d) if r["missing"]]
    if missing:
        raise CeremonyError("; ".join(missing))
    for name, md in d.roles.items():
        if md.signed.is_expired(when):
            raise CeremonyError(f"the draft's {name} expired at {md.signed.expires.isoformat()}")


def record(d: Draft) -> dict[str, Any]:
    """What the audit record of a published draft says: versions, who signed each role, the keys by URI."""
    return {
        "versions": {name: md.signed.version for name, md in d.roles.items()},
        "signed_by": {name: sorted(md.signatures) for name, md in d.roles.items()},
        "root_keys": sorted(d.root.signed.roles["root"].keyids),
        "root_threshold": d.root.signed.roles["root"].threshold,
        "new_keys": {name: {"uri": printable(e["uri"]), "keyid": e["keyid"]} for name, e in d.keys.items()},
    }


def publish(d: Draft, repo: Repository) -> dict[str, int]:
    """Check ``d`` (:func:`verify`) and publish it; role -> version published."""
    verify(d, repo)
    keys = {name: (entry["uri"], Key.from_dict(entry["keyid"], dict(entry["public_key"]))) for name, entry in d.keys.items()}
    offline = {name: md for name, md in d.roles.items() if name != "root"}
    return repo.publish_signed(d.root, offline, keys).signed
