"""The one hash check: accepted algorithms, malformed digests, streaming length and hash verdicts."""

import hashlib

import pytest

from proxy.protocol.errors import HashMismatch, LengthMismatch
from proxy.protocol.hashing import StreamingVerifier, UnsupportedHashes, accepted_hashes, verify_bytes

DATA = b"x" * 1000
SHA256 = hashlib.sha256(DATA).hexdigest()
BLAKE = hashlib.blake2b(DATA, digest_size=32).hexdigest()


def test_accepted_hashes_keeps_known_algorithms_only():
    assert accepted_hashes("t", {"md5": "0" * 32, "sha256": SHA256}) == {"sha256": SHA256}


@pytest.mark.parametrize("hashes", [{}, {"md5": "0" * 32}, {"sha1": "0" * 40}])
def test_no_accepted_hash_is_a_typed_refusal(hashes):
    with pytest.raises(UnsupportedHashes) as e:
        accepted_hashes("packages/p/f.whl", hashes)
    assert e.value.reason == "unsupported-hash" and e.value.target == "packages/p/f.whl"


@pytest.mark.parametrize("value", ["abc", SHA256.upper(), SHA256 + "0", "g" * 64, 12])
def test_malformed_digest_is_a_typed_refusal(value):
    with pytest.raises(UnsupportedHashes):
        accepted_hashes("t", {"sha256": value})


def test_stream_in_chunks_matches():
    v = StreamingVerifier("t", {"sha256": SHA256, "blake2b-256": BLAKE}, len(DATA))
    for i in range(0, len(DATA), 7):
        v.update(DATA[i:i + 7])
    assert v.finish() == {"sha256": SHA256, "blake2b-256": BLAKE}


def test_too_long_refused_on_update_short_on_finish():
    v = StreamingVerifier("t", {"sha256": SHA256}, len(DATA))
    with pytest.raises(LengthMismatch):
        v.update(DATA + b"y")
    short = StreamingVerifier("t", {"sha256": SHA256}, len(DATA))
    short.update(DATA[:-1])
    with pytest.raises(LengthMismatch):
        short.finish()


def test_inexact_length_is_a_bound():
    v = StreamingVerifier("t", {"sha256": hashlib.sha256(b"ab").hexdigest()}, 10, exact=False)
    v.update(b"ab")
    v.finish()


def test_same_length_other_bytes_is_hash_mismatch():
    with pytest.raises(HashMismatch) as e:
        verify_bytes("t", {"sha256": SHA256}, len(DATA), b"y" * len(DATA))
    assert e.value.expected == SHA256 and e.value.actual != SHA256
