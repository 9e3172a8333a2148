"""kvtier.adapters.lmcache driven through LMCache 0.5.6's own classes.

LMCache's CreateConnector builds the connector from the external:// URL a
user writes, with a real LocalCPUBackend (LMCache's host allocator, on CPU)
and real LMCacheEngineConfig / LMCacheMetadata; keys are CacheEngineKeys.
The test makes the calls LMCache's remote backend makes (batched_contains,
batched_put, batched_get, exists, get, put, list, remove_sync, close) on
its event loop, on MemoryObjs from that allocator, and compares every byte.
Not exercised: LMCache's storage manager and its vLLM integration (no GPU,
no model), partial chunks (not stored by this connector)."""

import asyncio
import os

import numpy as np
import pytest

if os.environ.get("KVT_REQUIRE_ENGINES") != "1":
    pytest.importorskip("lmcache.v1.storage_backend.connector")

import torch  # noqa: E402
from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend.connector import CreateConnector  # noqa: E402
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend  # noqa: E402

from kvtier.adapters.lmcache import KvtierConnector  # noqa: E402

CHUNK = 16
URL = "external://localhost:0/kvtier.adapters.lmcache/?connector_name=KvtierConnector"


@pytest.fixture
def lmc(tmp_path):
    loop = asyncio.new_event_loop()
    made = []

    def make(reset=1):
        config = LMCacheEngineConfig.from_defaults(
            chunk_size=CHUNK, local_cpu=False, max_local_cpu_size=0.05, remote_url=URL, remote_serde="naive",
            extra_config={"kvtier": {"disk_path": str(tmp_path / "kv.cache"), "disk_blocks": 64,
                                     "disk_reset": reset}})
        metadata = LMCacheMetadata(model_name="pytest/model", world_size=1, local_world_size=1, worker_id=0,
                                   local_worker_id=0, kv_dtype=torch.bfloat16, kv_shape=(2, 2, CHUNK, 2, 16),
                                   chunk_size=CHUNK)
        backend = LocalCPUBackend(config, metadata)
        conn = CreateConnector(URL, loop, backend, config, metadata)
        made.append(conn)
        return conn, backend, metadata

    def run(coro):
        return loop.run_until_complete(coro)

    yield make, run
    for conn in made:
        if not conn.getWrappedConnector().cache.closed:
            run(conn.close())
    loop.close()


def key(i, metadata):
    return CacheEngineKey(model_name=metadata.model_name, world_size=1, worker_id=0,
                          chunk_hash=(i * 0x9E3779B97F4A7C15) & (2 ** 64 - 1), dtype=torch.bfloat16)


def chunk(backend, conn, seed):
    inner = conn.getWrappedConnector()
    mo = backend.allocate(inner.meta_shapes, inner.meta_dtypes, inner.meta_fmt)
    data = np.random.default_rng(seed).integers(0, 256, len(mo.byte_array), dtype=np.uint8)
    np.frombuffer(mo.byte_array, dtype=np.uint8)[:] = data
    return mo, data.tobytes()


def test_create_connector_from_url(lmc):
    make, run = lmc
    conn, backend, md = make()
    inner = conn.getWrappedConnector()  # LMCache wraps every connector to count its calls
    assert isinstance(inner, KvtierConnector)
    assert inner.cache.block_bytes() == inner.full_chunk_size_bytes == 2 * 2 * CHUNK * 2 * 16 * 2
    assert conn.support_batched_get() and conn.support_batched_put() and conn.support_batched_contains()


def test_put_contains_get_every_byte(lmc):
    make, run = lmc
    conn, backend, md = make()
    keys = [key(i, md) for i in range(4)]
    objs = [chunk(backend, conn, i) for i in range(4)]
    assert conn.batched_contains(keys) == 0
    run(conn.batched_put(keys[:3], [mo for mo, _ in objs[:3]]))
    run(conn.put(keys[3], objs[3][0]))
    assert conn.batched_contains(keys) == 4
    assert run(conn.batched_async_contains("lookup-1", keys)) == 4
    assert run(conn.exists(keys[2])) and conn.exists_sync(keys[0])
    got = run(conn.batched_get(keys))
    for (mo, want), g in zip(objs, got):
        assert g is not None and g is not mo and bytes(g.byte_array) == want
        g.ref_count_down()
    one = run(conn.get(keys[1]))
    assert bytes(one.byte_array) == objs[1][1]
    one.ref_count_down()
    assert sorted(run(conn.list())) == sorted(k.to_string() for k in keys)


def test_missing_key_ends_the_prefix(lmc):
    make, run = lmc
    conn, backend, md = make()
    keys = [key(10 + i, md) for i in range(3)]
    objs = [chunk(backend, conn, 10 + i) for i in range(3)]
    run(conn.batched_put(keys, [mo for mo, _ in objs]))
    assert conn.remove_sync(keys[1]) and not conn.remove_sync(keys[1])
    assert conn.batched_contains(keys) == 1
    assert run(conn.get(keys[1])) is None
    got = run(conn.batched_get(keys))
    assert bytes(got[0].byte_array) == objs[0][1] and got[1] is None and got[2] is None
    assert sorted(run(conn.list())) == sorted([keys[0].to_string(), keys[2].to_string()])


def test_restart_keeps_chunks(lmc):
    make, run = lmc
    conn, backend, md = make()
    keys = [key(20 + i, md) for i in range(2)]
    objs = [chunk(backend, conn, 20 + i) for i in range(2)]
    run(conn.batched_put(keys, [mo for mo, _ in objs]))
    run(conn.close())
    again, backend2, _ = make(reset=0)
    assert again.batched_contains(keys) == 2
    got = run(again.batched_get(keys))
    assert [bytes(g.byte_array) for g in got] == [want for _, want in objs]
