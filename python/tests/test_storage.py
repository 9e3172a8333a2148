"""Storage mode through the binding: the engine owns its memory, kvtier is the
tiers below it (register_storage, register_memory, exists, put_from,
get_into, remove, StorageJob, storage_collect)."""

import threading

import numpy as np
import pytest

import kvtier

BT = 16
LAYERS, SEGS, SEG = 2, 2, 256
BLOCK = LAYERS * SEGS * SEG


def pattern(n_blocks, salt=0):
    idx = np.arange(n_blocks * BLOCK, dtype=np.uint64).reshape(n_blocks, BLOCK)
    return ((idx * 7 + salt * 131 + (idx // BLOCK) * 17 + 3) % 251).astype(np.uint8)


@pytest.fixture
def storage(tmp_path):
    opened = []

    def make(host_blocks=64, disk_blocks=0, **cfg):
        if disk_blocks:
            cfg.setdefault("disk_path", str(tmp_path / "kv.cache"))
            cfg.setdefault("disk_reset", 1)
        c = kvtier.Cache(model_fingerprint="pytest-storage@v1", device=kvtier.Device.HOST,
                         host_blocks=host_blocks, disk_blocks=disk_blocks, block_tokens=BT, **cfg)
        opened.append(c)
        c.register_storage(SEG, LAYERS, SEGS)
        return c

    yield make
    for c in opened:
        c.close()


def opaque_keys(c, n, salt=0):
    return c.keys_from_opaque([bytes([salt, i % 256, i // 256]) * 12 for i in range(n)])


def block_pieces(pool):
    """Each block of pool (n, BLOCK) as its LAYERS * SEGS pieces, by address."""
    base = pool.ctypes.data
    n = pool.shape[0]
    addrs = base + np.arange(n * LAYERS * SEGS, dtype=np.uint64) * SEG
    return kvtier.pieces(SEG, addresses=addrs)


def test_register_storage_block_bytes_and_namespace(storage):
    c = storage()
    assert c.block_bytes() == BLOCK
    other = kvtier.Cache(model_fingerprint="pytest-storage@v1", device=kvtier.Device.HOST, host_blocks=4,
                         block_tokens=BT)
    with other:
        other.register_storage([SEG * 2] * 2, LAYERS, 1)  # same bytes, another geometry
        assert other.block_bytes() == BLOCK
        assert not np.array_equal(other.namespace(), c.namespace())


def test_pieces_table():
    p = kvtier.pieces(64, addresses=[4096, 8192])
    assert p.dtype == kvtier.PIECE_DTYPE and kvtier.PIECE_DTYPE.itemsize == kvtier.ffi.sizeof("kvt_piece")
    assert list(p["ptr"]) == [4096, 8192] and list(p["len"]) == [64, 64] and list(p["region"]) == [0, 0]
    q = kvtier.pieces([10, 20, 30], offsets=0, region=3)
    assert list(q["offset"]) == [0, 0, 0] and list(q["len"]) == [10, 20, 30] and list(q["region"]) == [3] * 3
    with pytest.raises(ValueError):
        kvtier.pieces(64, offsets=[0])  # offsets need a region
    with pytest.raises(ValueError):
        kvtier.pieces(64)


def test_put_get_round_trip_every_buffer_kind(storage):
    c = storage()
    n = 6
    src = pattern(n)
    keys = opaque_keys(c, n)
    # put: a list of numpy slices, one per segment
    segs = [src[b, s * SEG:(s + 1) * SEG] for b in range(n) for s in range(LAYERS * SEGS)]
    with c.put_from(keys, segs, opaque=True) as job:
        assert job.wait() == 0
        res, n_ok = job.results()
        assert list(res) == [0] * n and n_ok == n
    # get into a memoryview (whole blocks: one piece each)
    dst = bytearray(n * BLOCK)
    mv = memoryview(dst)
    with c.get_into(keys, [(mv[b * BLOCK:(b + 1) * BLOCK], BLOCK) for b in range(n)], opaque=True) as job:
        assert job.wait() == 0
        assert job.results()[1] == n
    assert bytes(dst) == src.tobytes()
    # get into a registered region by offsets
    dst2 = np.zeros((n, BLOCK), np.uint8)
    region = c.register_memory(dst2)
    assert region != kvtier.REGION_NONE
    with c.get_into(keys, kvtier.pieces(BLOCK, region=region, offsets=np.arange(n) * BLOCK), opaque=True) as job:
        assert job.wait() == 0
    np.testing.assert_array_equal(dst2, src)
    c.unregister_memory(region)
    # get into raw addresses: (int address, len)
    dst3 = np.zeros((n, BLOCK), np.uint8)
    with c.get_into(keys, block_pieces(dst3), opaque=True) as job:
        assert job.wait() == 0
    np.testing.assert_array_equal(dst3, src)


def test_torch_tensor_memory(storage):
    torch = pytest.importorskip("torch")
    c = storage()
    n = 4
    src = torch.from_numpy(pattern(n, salt=5).copy()).view(torch.float16)  # (n, BLOCK / 2) halves
    keys = opaque_keys(c, n, salt=5)
    with c.put_from(keys, [src[b] for b in range(n)], opaque=True) as job:
        assert job.wait() == 0
    dst = torch.zeros_like(src)
    region = c.register_memory(dst)
    with c.get_into(keys, kvtier.pieces(BLOCK, region=region, offsets=np.arange(n) * BLOCK), opaque=True) as job:
        assert job.wait() == 0
    assert torch.equal(dst.view(torch.uint8), src.view(torch.uint8))


def test_put_skips_stored_keys_and_get_stops_at_the_prefix(storage):
    c = storage()
    src = pattern(4, salt=1)
    keys = opaque_keys(c, 4, salt=1)
    with c.put_from(keys[:2], [src[0], src[1]], opaque=True) as job:
        job.wait()
    with c.put_from(keys, [src[b] for b in range(4)], opaque=True) as job:
        assert job.wait() == 0
        assert list(job.results()[0]) == [1, 1, 0, 0]  # the first two were skipped
    missing = opaque_keys(c, 1, salt=9)
    ask = np.concatenate([keys[:3], missing, keys[3:]])
    assert c.exists(ask, opaque=True).n_prefix == 3
    dst = np.zeros((5, BLOCK), np.uint8)
    with c.get_into(ask, [dst[b] for b in range(5)], opaque=True) as job:
        assert job.wait() == 0
        res, n_ok = job.results()
        assert list(res) == [0, 0, 0, 1, 1] and n_ok == 3
    np.testing.assert_array_equal(dst[:3], src[:3])
    assert not dst[3:].any()
    dst[:] = 0
    with c.get_into(keys, [dst[b] for b in range(4)], opaque=True, max_blocks=2) as job:
        job.wait()
        assert list(job.results()[0]) == [0, 0, 1, 1]
    np.testing.assert_array_equal(dst[:2], src[:2])
    assert not dst[2:].any()


def test_chained_keys_tokens_and_mismatch(storage):
    c = storage()
    tokens = (np.arange(3 * BT, dtype=np.uint32) * 7 + 11) % 30000
    keys = c.hash_tokens(tokens)
    src = pattern(3, salt=2)
    with c.put_from(keys, [src[b] for b in range(3)], tokens=tokens) as job:
        assert job.wait() == 0
    assert c.exists(keys).n_prefix == 3
    assert c.exists(keys[1:], parent=keys[0]).n_prefix == 2
    assert c.exists(keys[1:]).n_prefix == 0  # keys[1] is not a sequence start
    dst = np.zeros((3, BLOCK), np.uint8)
    with c.get_into(keys, [dst[b] for b in range(3)], tokens=tokens) as job:
        assert job.wait() == 0
    np.testing.assert_array_equal(dst, src)
    bad = tokens.copy()
    bad[BT + 1] += 1  # block 1 was stored with other tokens
    dst[:] = 0
    with c.get_into(keys, [dst[b] for b in range(3)], tokens=bad) as job:
        status = job.wait()
        res, n_ok = job.results()
    assert status == kvtier.EMISMATCH and res[1] == kvtier.EMISMATCH and n_ok == 1
    np.testing.assert_array_equal(dst[0], src[0])


def test_straight_to_disk_and_back_after_restart(storage, tmp_path):
    path = str(tmp_path / "restart.cache")
    c = storage(host_blocks=0, disk_blocks=64, disk_path=path)
    n = 8
    src = pattern(n, salt=3)
    keys = opaque_keys(c, n, salt=3)
    with c.put_from(keys, [src[b] for b in range(n)], opaque=True) as job:
        assert job.wait() == 0
    r = c.exists(keys, opaque=True, tiers=True)
    assert r.n_prefix == n and r.n_disk == n and list(r.tiers) == [kvtier.Tier.DISK] * n
    c.close()
    c2 = storage(host_blocks=0, disk_blocks=64, disk_path=path, disk_reset=0)
    assert c2.exists(keys, opaque=True).n_disk == n
    dst = np.zeros((n, BLOCK), np.uint8)
    with c2.get_into(keys, [dst[b] for b in range(n)], opaque=True) as job:
        assert job.wait() == 0
    np.testing.assert_array_equal(dst, src)


def test_remove(storage):
    c = storage(disk_blocks=32)
    src = pattern(3, salt=4)
    keys = opaque_keys(c, 3, salt=4)
    with c.put_from(keys, [src[b] for b in range(3)], opaque=True) as job:
        job.wait()
    assert c.remove(keys[1:2]) == 1
    assert c.remove(keys[1:2]) == 0
    assert c.exists(keys, opaque=True).n_prefix == 1
    assert c.exists(keys[2:], opaque=True).n_prefix == 1


def test_collect_reports_each_job_once(storage):
    c = storage()
    src = pattern(8, salt=6)
    keys = opaque_keys(c, 8, salt=6)
    jobs = [c.put_from(keys[i:i + 2], [src[i], src[i + 1]], opaque=True) for i in range(0, 8, 2)]
    for j in jobs:
        j.wait()
    got = c.storage_collect(max_jobs=3)  # more than max: the call loops
    assert sorted(j.handle for j, _ in got) == sorted(j.handle for j in jobs)
    assert all(status == 0 and isinstance(j, kvtier.StorageJob) for j, status in got)
    assert c.storage_collect() == []
    for j, _ in got:
        assert j.results()[1] == 2
        j.release()
        j.release()  # idempotent


def test_errors_carry_code_and_text(storage):
    c = storage()
    keys = opaque_keys(c, 2)
    buf = np.zeros((2, BLOCK), np.uint8)
    with pytest.raises(kvtier.KvtError) as e:
        c.put_from(keys, [buf[0][:100], buf[1][:100]], opaque=True)  # pieces short of a block
    assert e.value.code == -22 and e.value.call == "kvt_put_from" and e.value.text == kvtier.strerror(-22)
    with pytest.raises(ValueError):
        c.put_from(keys, [buf[0]] * 3, opaque=True)  # 3 pieces for 2 blocks
    with pytest.raises(kvtier.KvtError) as e:
        c.unregister_memory(12345)
    assert e.value.code == kvtier.ENOJOB and e.value.name == "KVT_ENOJOB"
    with pytest.raises(kvtier.KvtError) as e:
        c.register_memory(buf, kind=kvtier.MEM_DEVICE)  # not device memory / no CUDA in this build
    assert e.value.code in (kvtier.EUNSUPPORTED, kvtier.ENODEV)
    r = c.register_memory(buf)
    with pytest.raises(kvtier.KvtError) as e:
        c.register_memory(buf[1])  # overlaps
    assert e.value.code == -22
    c.unregister_memory(r)
    with pytest.raises(kvtier.KvtError) as e:
        kvtier.StorageJob(c, 99, 1, "put", None).wait()  # a handle the cache never gave
    assert e.value.code == kvtier.ENOJOB
    owner = kvtier.Cache(model_fingerprint="owner", device=kvtier.Device.HOST, host_blocks=4, block_tokens=BT)
    with owner:
        pool = np.zeros((1, 1, 4, BLOCK), np.uint8)
        owner.register_pool(pool)
        with pytest.raises(kvtier.KvtError) as e:
            owner.put_from(owner.keys_from_opaque([b"k" * 16]), [buf[0]], opaque=True)
        assert e.value.code == kvtier.ESTATE
    c.close()
    with pytest.raises(ValueError):
        c.exists(keys)


def test_job_slots_run_out_with_eagain(storage):
    c = storage(max_jobs=4)
    src = pattern(1)
    held = []
    with pytest.raises(kvtier.KvtError) as e:
        for i in range(64):
            held.append(c.put_from(opaque_keys(c, 1, salt=100 + i % 50), [src[0]], opaque=True))
    assert e.value.code == kvtier.EAGAIN
    for j in held:
        j.wait()
        j.release()
    with c.put_from(opaque_keys(c, 1, salt=200), [src[0]], opaque=True) as job:  # slots are back
        assert job.wait() == 0


def test_threads_share_one_cache(storage):
    c = storage(host_blocks=256, disk_blocks=512)
    errors = []

    def worker(t):
        try:
            for r in range(10):
                n = 4
                src = pattern(n, salt=t * 100 + r)
                keys = opaque_keys(c, n, salt=t * 20 + r)
                with c.put_from(keys, [src[b] for b in range(n)], opaque=True) as job:
                    assert job.wait() == 0
                dst = np.zeros_like(src)
                with c.get_into(keys, [dst[b] for b in range(n)], opaque=True) as job:
                    assert job.wait() == 0
                    assert job.results()[1] == n
                np.testing.assert_array_equal(dst, src)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_released_in_flight_job_keeps_its_buffers(storage, tmp_path):
    path = str(tmp_path / "detached.cache")
    c = storage(disk_blocks=64, host_blocks=0, disk_path=path)
    src = pattern(8, salt=7)
    keys = opaque_keys(c, 8, salt=7)
    job = c.put_from(keys, [bytes(src[b]) for b in range(8)], opaque=True)  # read-only buffers
    job.release()  # detached: the cache holds the bytes objects, nobody else does
    del job
    c.close()  # the storage workers finish what is queued
    c2 = storage(disk_blocks=64, host_blocks=0, disk_path=path, disk_reset=0)
    assert c2.exists(keys, opaque=True).n_prefix == 8
    dst = np.zeros_like(src)
    with c2.get_into(keys, [dst[b] for b in range(8)], opaque=True) as j:
        assert j.wait() == 0
    np.testing.assert_array_equal(dst, src)


def test_promote_and_touch(storage):
    # A host tier of 2 over a disk: blocks put first end on disk only.
    c = storage(host_blocks=2, disk_blocks=16)
    src = pattern(4, salt=5)
    keys = opaque_keys(c, 4, salt=5)
    with c.put_from(keys, [src[b] for b in range(4)], opaque=True) as job:
        assert job.wait() == 0
    c.drain()
    assert list(c.exists(keys[:2], opaque=True, tiers=True).tiers) == [kvtier.Tier.DISK] * 2
    dst = np.zeros((2, BLOCK), np.uint8)
    with c.get_into(keys[:2], [dst[0], dst[1]], opaque=True) as job:
        assert job.wait() == 0
    assert c.exists(keys[:2], opaque=True).n_disk == 2  # a plain get leaves them on disk
    dst[:] = 0
    with c.get_into(keys[:2], [dst[0], dst[1]], opaque=True, promote=True) as job:
        assert job.wait() == 0
    np.testing.assert_array_equal(dst, src[:2])
    assert c.exists(keys[:2], opaque=True).n_host == 2  # promoted: the host tier holds them now
    assert c.touch(keys, opaque=True) == 4
    assert c.touch(opaque_keys(c, 2, salt=77), opaque=True) == 0
