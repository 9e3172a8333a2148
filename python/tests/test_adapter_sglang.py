"""kvtier.adapters.sglang driven through SGLang 0.5.23's own classes.

SGLang's StorageBackendFactory builds the backend from the `dynamic` config a
user writes; its host KV pool is the real MHATokenToKVPoolHost, built over
CPU tensors standing in for the device pool (both layouts SGLang offers for
zero-copy storage: layer_first, page_first); page keys come from SGLang's
own get_storage_hash_str. The cache controller's storage methods
(_page_set_zero_copy, _page_get_zero_copy: the calls of a backup and of a
prefetch with interface_v1) run as upstream wrote them, on an object that
carries only the attributes they read (storage_backend, mem_pool_host). The
controller's threads, the radix tree and the device<->host copies are not
run (no GPU); every byte that comes back into the host pool is compared."""

import os

import numpy as np
import pytest

if os.environ.get("KVT_REQUIRE_ENGINES") != "1":
    pytest.importorskip("sglang.srt.mem_cache.pool_host.mha")

import torch  # noqa: E402
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, HiCacheStorageExtraInfo  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402

from kvtier.adapters.sglang import KvtierHiCacheStorage  # noqa: E402

LAYERS, HEADS, DIM, PAGE, TOKENS = 2, 2, 16, 4, 64


class _Controller:
    """The attributes HiCacheController's storage methods read."""

    def __init__(self, backend, pool):
        self.storage_backend = backend
        self.mem_pool_host = pool
        self.storage_host_pool = pool
        self.page_size = pool.page_size


def host_pool(layout):
    k = tuple(torch.zeros(TOKENS + PAGE, HEADS, DIM, dtype=torch.bfloat16) for _ in range(LAYERS))
    v = tuple(torch.zeros(TOKENS + PAGE, HEADS, DIM, dtype=torch.bfloat16) for _ in range(LAYERS))

    def ptrs(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                                           layout=KVBufferLayout.NHD),
                         page_size=PAGE, head_num=HEADS, head_dim=DIM, v_head_dim=DIM, dtype=torch.bfloat16,
                         device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS)


def storage_config(tmp_path, **extra):
    cfg = {"backend_name": "kvtier", "module_path": "kvtier.adapters.sglang",
           "class_name": "KvtierHiCacheStorage", "interface_v1": 1,
           "disk_path": str(tmp_path / "kv.cache"), "disk_blocks": 128, "disk_reset": 1, "host_blocks": 0}
    cfg.update(extra)
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                is_mla_model=False, enable_storage_metrics=True, is_page_first_layout=False,
                                model_name="pytest/model", extra_config=cfg)


@pytest.fixture(params=["layer_first", "page_first"])
def setup(request, tmp_path):
    pool = host_pool(request.param)
    made = []

    def make(**extra):
        backend = StorageBackendFactory.create_backend("dynamic", storage_config(tmp_path, **extra), pool)
        backend.register_mem_pool_host(pool)  # as HiCacheController does after creating it
        made.append(backend)
        return backend

    yield pool, make
    for b in made:
        b.close()


def fill_pages(pool, indices, seed):
    """Known bytes in the host pool's pages at indices (what a device->host backup left there)."""
    buf = pool.kv_buffer.view(torch.uint8)
    ptrs, sizes = pool.get_page_buffer_meta(indices)
    base = buf.data_ptr()
    rng = np.random.default_rng(seed)
    flat = buf.reshape(-1).numpy()
    for p, s in zip(ptrs, sizes):
        flat[p - base:p - base + s] = rng.integers(0, 256, s, dtype=np.uint8)


def page_bytes(pool, indices):
    buf = pool.kv_buffer.view(torch.uint8).reshape(-1).numpy()
    base = pool.kv_buffer.data_ptr()
    ptrs, sizes = pool.get_page_buffer_meta(indices)
    return b"".join(buf[p - base:p - base + s].tobytes() for p, s in zip(ptrs, sizes))


def hashes(n_pages, seed=0):
    tokens = [int(x) for x in (np.arange(n_pages * PAGE) * 7 + seed * 1000) % 32000]
    return get_storage_hash_str(tokens, None, page_size=PAGE)


def test_factory_builds_the_dynamic_backend(setup):
    pool, make = setup
    backend = make()
    assert isinstance(backend, KvtierHiCacheStorage)
    ptrs, sizes = pool.get_page_buffer_meta(torch.arange(PAGE))
    assert backend.cache.block_bytes() == sum(sizes) == LAYERS * 2 * PAGE * HEADS * DIM * 2


def test_backup_then_prefetch_into_other_pages(setup):
    pool, make = setup
    backend = make()
    ctl = _Controller(backend, pool)
    keys = hashes(5)
    assert len(keys) == 5 and all(len(k) == 64 for k in keys)
    src = pool.alloc(5 * PAGE)
    fill_pages(pool, src, seed=1)
    want = page_bytes(pool, src)
    assert backend.batch_exists(keys) == 0
    assert HiCacheController._page_set_zero_copy(ctl, keys, src, HiCacheStorageExtraInfo(prefix_keys=[]))
    assert backend.batch_exists(keys, HiCacheStorageExtraInfo(prefix_keys=[])) == 5
    assert backend.exists(keys[3]) and not backend.exists(hashes(1, seed=9)[0])
    # Prefix semantics: a missing page in the middle ends the count.
    assert backend.batch_exists(keys[:2] + hashes(1, seed=9) + keys[2:]) == 2
    dst = pool.alloc(5 * PAGE)
    assert page_bytes(pool, dst) != want
    n = HiCacheController._page_get_zero_copy(ctl, type("Op", (), {"request_id": "r1"})(), keys, dst)
    assert n == 5
    assert page_bytes(pool, dst) == want
    stats = backend.get_stats()
    assert stats.backup_pgs == [5] and stats.prefetch_pgs == [5]
    assert backend.get_stats().backup_pgs == []  # reset on read


def test_prefetch_stops_at_the_first_missing_page(setup):
    pool, make = setup
    backend = make()
    ctl = _Controller(backend, pool)
    keys = hashes(4, seed=2)
    src = pool.alloc(4 * PAGE)
    fill_pages(pool, src, seed=2)
    want = page_bytes(pool, src)
    assert all(backend.batch_set_v1(keys, src))
    backend.delete(keys[2])
    dst = pool.alloc(4 * PAGE)
    before = page_bytes(pool, dst)
    results = backend.batch_get_v1(keys, dst)
    assert results == [True, True, False, False]
    page = len(want) // 4
    assert page_bytes(pool, dst)[:2 * page] == want[:2 * page]
    assert page_bytes(pool, dst)[2 * page:] == before[2 * page:]
    op = type("Op", (), {"request_id": "r2"})()
    assert HiCacheController._page_get_zero_copy(ctl, op, keys, dst) == 2


def test_set_again_is_a_success_and_restart_keeps_pages(setup, tmp_path):
    pool, make = setup
    backend = make()
    keys = hashes(3, seed=3)
    src = pool.alloc(3 * PAGE)
    fill_pages(pool, src, seed=3)
    want = page_bytes(pool, src)
    assert backend.batch_set_v1(keys, src) == [True] * 3
    assert backend.batch_set_v1(keys, src) == [True] * 3  # already stored: skipped, still a success
    backend.close()
    again = make(disk_reset=0)  # a restarted SGLang on the same disk
    assert again.batch_exists(keys) == 3
    dst = pool.alloc(3 * PAGE)
    assert again.batch_get_v1(keys, dst) == [True] * 3
    assert page_bytes(pool, dst) == want


def test_tensor_interface_through_the_controller(setup):
    pool, make = setup
    backend = make()
    ctl = _Controller(backend, pool)
    keys = hashes(2, seed=4)
    src = pool.alloc(2 * PAGE)
    fill_pages(pool, src, seed=4)
    assert HiCacheController._generic_page_set(ctl, keys, src)  # the controller's non-v1 backup
    for i, key in enumerate(keys):
        want = pool.get_data_page(src[i * PAGE]).contiguous()
        got = backend.get(key, torch.empty_like(want))
        assert got is not None and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert backend.get(hashes(1, seed=8)[0]) is None
    assert backend.batch_get([keys[0], hashes(1, seed=8)[0]])[1] is None
    one = pool.get_data_page(src[0]).contiguous()
    assert backend.set("custom-key", one) and backend.exists("custom-key")
    with pytest.raises(ValueError):
        backend.set("short", one[:3])


def test_clear_drops_everything(setup):
    pool, make = setup
    backend = make()
    keys = hashes(2, seed=5)
    src = pool.alloc(2 * PAGE)
    fill_pages(pool, src, seed=5)
    backend.batch_set_v1(keys, src)
    assert backend.batch_exists(keys) == 2
    backend.clear()
    assert backend.batch_exists(keys) == 0
