"""The binding on its own: every C function through the Python surface."""

import errno
import os
import re
import threading

import numpy as np
import pytest

import kvtier
from kvtier._lib import ffi

from conftest import BLOCK_BYTES, BT, LAYERS, SEG_BYTES, SEGS, block_pattern, check, fill, tokens_for


# ---- version, errors, structs --------------------------------------------

def test_version():
    v = kvtier.version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", v)
    major, minor, patch = (int(x) for x in v.split("."))
    assert kvtier.version_number() == major * 10000 + minor * 100 + patch


def test_strerror_names_every_code():
    assert kvtier.strerror(0) == "success"
    assert kvtier.strerror(1) == "in progress"
    assert kvtier.strerror(-errno.ENOENT) == os.strerror(errno.ENOENT)
    assert kvtier.strerror(-5000) == "unknown kvtier error code"
    texts = set()
    for name in ("EMISS", "EMISMATCH", "ENOSPACE", "ENODEV", "ECORRUPT", "ECANCELED", "EBUSY", "ELAYOUT",
                 "ESTATE", "EVERSION", "EAGAIN", "ENOJOB", "EUNSUPPORTED", "ENAMESPACE", "ETIMEDOUT",
                 "EFORKED", "ELOCKED", "EREMOTE", "EAUTH"):
        code = getattr(kvtier, name)
        text = kvtier.strerror(code)
        assert text != "unknown kvtier error code", name
        texts.add(text)
        e = kvtier.KvtError(code, "kvt_x")
        assert (e.code, e.name, e.text) == (code, "KVT_" + name, text)
        assert str(e) == "kvt_x: %s (KVT_%s, %d)" % (text, name, code)
    assert len(texts) == 19
    assert kvtier.KvtError(-errno.EINVAL).name == "EINVAL"


def test_struct_sizes_match_the_library():
    # The *_init functions write sizeof() as the library sees it.
    assert kvtier.Config()._c.size == ffi.sizeof("kvt_config")
    assert kvtier.ModelDesc()._c.size == ffi.sizeof("kvt_model_desc")
    assert kvtier.HwDesc()._c.size == ffi.sizeof("kvt_hw_desc")
    assert kvtier.layout_defaults()["size"] == ffi.sizeof("kvt_layout")


def test_config_defaults_land_in_their_fields():
    d = kvtier.config_defaults()
    assert d["block_tokens"] == 16 and d["dtype"] == kvtier.Dtype.BF16
    assert (d["tp_rank"], d["tp_size"], d["tenant_salt"]) == (0, 1, 0)
    assert d["device"] == kvtier.Device.AUTO and d["disk_backend"] == kvtier.DiskBackend.AUTO
    assert d["disk_queue_depth"] == 0 and d["write_policy"] == kvtier.WritePolicy.BACK
    assert (d["max_requests"], d["max_jobs"], d["max_job_blocks"]) == (1024, 256, 8192)
    assert d["model_fingerprint"] is None and d["disk_path"] is None
    lay = kvtier.layout_defaults()
    assert lay["segments"] == 0 and lay["flags"] == 0
    cfg = kvtier.Config(model_fingerprint="m", disk_path="/nonexistent/x")
    assert cfg.model_fingerprint == "m" and cfg.disk_path == "/nonexistent/x"
    with pytest.raises(AttributeError):
        cfg.no_such_field = 1
    with pytest.raises(AttributeError):
        cfg.size = 4


def test_hw_and_model_descriptions():
    hw = kvtier.HwDesc()
    assert (hw.num_gpus, hw.flops_per_gpu, hw.mfu, hw.overlap) == (1, 989e12, 0.5, 1)
    assert (hw.device_host.bytes_per_s, hw.device_host.latency_s) == (24e9, 10e-6)
    assert (hw.host_disk.bytes_per_s, hw.host_disk.latency_s) == (6.5e9, 100e-6)
    hw.device_host = (12e9, 5e-6)
    hw.host_disk = {"bytes_per_s": 3e9}
    assert hw.to_dict()["device_host"] == {"bytes_per_s": 12e9, "latency_s": 5e-6}
    assert hw.host_disk.bytes_per_s == 3e9 and hw.host_disk.latency_s == 100e-6

    names = kvtier.model_preset_names()
    assert "llama3-8b" in names and "deepseek-v3" in names and "tinyllm" in names
    m = kvtier.ModelDesc.preset("llama3-8b")
    assert (m.num_layers, m.num_kv_heads, m.head_dim) == (32, 8, 128)
    assert m.kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2
    assert 7.5e9 < m.param_count() < 8.5e9
    m.name = "renamed"
    assert m.name == "renamed"
    with pytest.raises(ValueError):
        m.name = "x" * 32
    with pytest.raises(kvtier.KvtError) as ei:
        kvtier.ModelDesc.preset("no-such-model")
    assert ei.value.code == -errno.ENOENT
    assert kvtier.ModelDesc().kv_bytes_per_token() == 0  # invalid: no layers


def test_cost_functions():
    m, hw = kvtier.ModelDesc.preset("llama3-8b"), kvtier.HwDesc()
    total, linear = kvtier.cost_recompute_flops(m, 0, 1000)
    assert linear == pytest.approx(2 * m.param_count() * 1000)
    assert total > linear
    assert kvtier.cost_compute_s(m, hw, 0, 1000) == pytest.approx(total / (hw.flops_per_gpu * hw.mfu))
    assert kvtier.cost_transfer_s(hw, 24_000_000, 0) == pytest.approx(10e-6 + 1e-3)
    assert kvtier.cost_transfer_s(hw, 0, 0) == 0
    plan = kvtier.cost_plan(m, hw, 16, 4096, [kvtier.Tier.HOST] * 200)
    assert (plan.n_blocks, plan.n_prefix, plan.n_host) == (256, 200, 200)
    assert plan.decision == kvtier.Decision.RESTORE and plan.restore_blocks == 200
    assert plan.recompute_tokens == 4096 - 200 * 16
    assert plan.bytes_from_host == 200 * 16 * m.kv_bytes_per_token()
    slow = kvtier.HwDesc(device_host=(1e6, 1e-3))
    assert kvtier.cost_plan(m, slow, 16, 4096, [kvtier.Tier.HOST] * 200).decision == kvtier.Decision.RECOMPUTE
    bw = kvtier.cost_breakeven(m, hw, 4096, 2048)
    assert 0 < bw < 24e9
    with pytest.raises(kvtier.KvtError) as ei:
        kvtier.cost_plan(m, hw, 0, 4096)
    assert ei.value.code == -errno.EINVAL


# ---- lifecycle ------------------------------------------------------------

def test_open_errors_carry_code_and_text(tmp_path):
    with pytest.raises(kvtier.KvtError) as ei:
        kvtier.Cache(device=kvtier.Device.HOST)  # no model_fingerprint
    assert ei.value.code == -errno.EINVAL and ei.value.call == "kvt_open"
    with pytest.raises(kvtier.KvtError) as ei:
        kvtier.Cache(model_fingerprint="m", block_tokens=15)
    assert ei.value.code == -errno.EINVAL
    with pytest.raises(TypeError):
        kvtier.Cache(kvtier.Config(model_fingerprint="m"), host_blocks=1)


def test_cuda_without_a_device_fails_with_enodev():
    pool = np.zeros((1, 1, 4, 64), dtype=np.uint8)
    try:
        c = kvtier.Cache(model_fingerprint="m", device=kvtier.Device.CUDA)
    except kvtier.KvtError as e:  # a build without the CUDA backend
        assert e.code == kvtier.ENODEV
        return
    with c:
        try:
            c.register_pool(pool)
        except kvtier.KvtError as e:
            assert e.code == kvtier.ENODEV and e.call == "kvt_register_layout"
            assert "no usable device" in str(e)
        else:
            pytest.skip("a GPU is usable here: the no-device path does not run")


def test_context_manager_and_close(make_cache):
    c, _ = make_cache()
    assert c.device_backend_name() == "host" and c.disk_backend_name() == "none"
    assert c.block_bytes() == BLOCK_BYTES
    assert c.handle != 0
    with c as same:
        assert same is c
    assert c.closed
    c.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        c.lookup(np.zeros((1, 2), np.uint64))


def test_register_layout_checks(make_cache):
    c = kvtier.Cache(model_fingerprint="m", device=kvtier.Device.HOST)
    with c:
        with pytest.raises(kvtier.KvtError) as ei:  # before registration
            c.lookup(np.zeros((1, 2), np.uint64))
        assert ei.value.code in (kvtier.ELAYOUT, kvtier.ESTATE)
        small = np.zeros(1000, np.uint8)
        with pytest.raises(ValueError, match="need"):
            c.register_layout(1, 1, 4, [(small, 512, 512)])
        with pytest.raises(ValueError, match="expected 2 segments"):
            c.register_layout(1, 2, 4, [(small, 128, 128)])
        with pytest.raises(BufferError):
            c.register_layout(1, 1, 4, [(b"\0" * 4096, 1024, 1024)])  # read-only
        c.register_layout(1, 1, 4, [(small, 200, 100)])
        assert c.block_bytes() == 100
        with pytest.raises(kvtier.KvtError) as ei:  # once per cache
            c.register_layout(1, 1, 4, [(small, 200, 100)])
        assert ei.value.code == kvtier.ESTATE


def test_metadata_only_layout_and_namespace():
    with kvtier.Cache(model_fingerprint="a", device=kvtier.Device.HOST) as a, \
         kvtier.Cache(model_fingerprint="b", device=kvtier.Device.HOST) as b:
        a.register_layout(4, 2, 64)
        b.register_layout(4, 2, 64)
        assert a.block_bytes() == 0
        ns_a, ns_b = a.namespace(), b.namespace()
        assert ns_a.shape == (1, 2) and not np.array_equal(ns_a, ns_b)
        t = tokens_for(2)
        assert not np.array_equal(a.hash_tokens(t), b.hash_tokens(t))
        with a.acquire(a.hash_tokens(t)) as r:  # no bytes move, bookkeeping does
            assert len(r.slots) == 2
            r.commit()
        assert a.lookup(a.hash_tokens(t)).n_device == 2


# ---- keys -----------------------------------------------------------------

def test_hash_tokens_chains_and_skips_the_partial_block(make_cache):
    c, _ = make_cache()
    t = tokens_for(4)
    k = c.hash_tokens(t)
    assert k.shape == (4, 2) and k.dtype == np.uint64
    assert len({tuple(x) for x in k}) == 4
    np.testing.assert_array_equal(c.hash_tokens(list(t[: 3 * BT + 5])), k[:3])
    np.testing.assert_array_equal(c.hash_tokens(t[2 * BT:], parent=k[1]), k[2:])
    np.testing.assert_array_equal(c.hash_tokens(t[:BT]), k[:1])
    assert c.hash_tokens(t[: BT - 1]).shape == (0, 2)
    t2 = t.copy()
    t2[BT] += 1  # block 1 differs: keys from block 1 on differ
    k2 = c.hash_tokens(t2)
    np.testing.assert_array_equal(k2[0], k[0])
    assert all(not np.array_equal(k2[i], k[i]) for i in range(1, 4))
    with pytest.raises(ValueError):
        c.hash_tokens(t, parent=k[:2])


def test_keys_in_every_accepted_form(make_cache):
    c, pool = make_cache()
    keys = c.hash_tokens(tokens_for(3))
    with c.acquire(keys[:2]) as r:
        fill(pool, r.slots)
        r.commit()
    as_bytes = kvtier.keys_to_bytes(keys)
    assert len(as_bytes) == 48 and as_bytes[:8] == int(keys[0, 0]).to_bytes(8, "little")
    forms = [keys, as_bytes, bytearray(as_bytes), memoryview(as_bytes),
             [as_bytes[i:i + 16] for i in range(0, 48, 16)],
             np.frombuffer(as_bytes, np.uint8).reshape(3, 16), keys.tolist(),
             np.frombuffer(b"\0" + as_bytes, np.uint8)[1:].reshape(3, 16)]  # misaligned: copied
    for f in forms:
        res = c.lookup(f)
        assert (res.n_blocks, res.n_prefix, res.n_device) == (3, 2, 2), type(f)
    with pytest.raises(ValueError):
        c.lookup(as_bytes[:40])
    with pytest.raises(ValueError):
        c.lookup([b"short"])
    with pytest.raises(ValueError):
        c.lookup(np.zeros((2, 3), np.uint64))


def test_keys_from_opaque(make_cache):
    c, _ = make_cache()
    raw = bytes(range(64))  # two 32-byte vLLM-style hashes
    k = c.keys_from_opaque(raw, 32)
    assert k.shape == (2, 2)
    np.testing.assert_array_equal(c.keys_from_opaque([raw[:32], raw[32:]]), k)
    np.testing.assert_array_equal(c.keys_from_opaque(np.frombuffer(raw, np.uint8).reshape(2, 32)), k)
    np.testing.assert_array_equal(c.keys_from_opaque(raw[:32], 32), k[:1])  # per key, no chaining
    assert not np.array_equal(k[0], k[1])
    assert not np.array_equal(c.keys_from_opaque(raw[:16] * 2, 16)[0], c.keys_from_opaque(raw[:32], 32)[0])
    assert c.keys_from_opaque([]).shape == (0, 2)
    with pytest.raises(ValueError):
        c.keys_from_opaque(raw, 30)
    with pytest.raises(ValueError):
        c.keys_from_opaque([b"a" * 32, b"b" * 16])
    with pytest.raises(ValueError):
        c.keys_from_opaque(raw)


# ---- read and write paths -------------------------------------------------

def test_round_trip_through_host_and_disk(make_cache):
    c, pool = make_cache(slots=16, host_blocks=8, disk_blocks=64)
    assert c.disk_backend_name() in ("io_uring", "threads")
    t = tokens_for(8)
    keys = c.hash_tokens(t)
    r = c.acquire(keys, t, extra_slots=1)
    assert r.info == (0, 0, 0, 0) and not r.loading and len(r.slots) == 9
    fill(pool, r.slots[:8])
    r.commit()
    r.release()
    assert c.lookup(keys).n_device == 8

    with c.store(keys, evict=True) as job:  # idle: down to the host tier
        assert job.started
        job.wait()
        assert job.poll() is True
    res = c.lookup(keys, tiers=True)
    assert (res.n_prefix, res.n_device, res.n_host) == (8, 0, 8)
    assert list(res.tiers) == [kvtier.Tier.HOST] * 8

    pool[:] = 0xEE  # whatever the engine did with the slots since
    with c.acquire(keys, t) as r:
        assert r.loading and r.info.n_restore == 8 and r.info.n_loading == 8
        assert r.wait() == 8
        check(pool, r.slots)
        r.commit()

    # Another 8 blocks evict the first ones from the 8-slot host tier to disk.
    t2 = tokens_for(8, seed=1)
    k2 = c.hash_tokens(t2)
    with c.acquire(k2, t2) as r:
        fill(pool, r.slots, salt=1)
        r.commit()
    with c.store(keys, evict=True) as j1:
        j1.wait()
    with c.store(k2, evict=True) as j2:
        j2.wait()
    c.drain()
    res = c.lookup(keys)
    assert res.n_prefix == 8 and res.n_disk > 0

    pool[:] = 0x11
    for _ in range(10):  # disk -> host ahead of the request; the host tier spills first
        try:
            job = c.prefetch(keys)
            break
        except kvtier.KvtError as e:
            assert e.code == kvtier.EAGAIN
            c.drain()
    with job:
        job.wait()
    assert c.lookup(keys).n_disk < res.n_disk
    with c.acquire(keys, t) as r:
        assert r.wait() == 8
        check(pool, r.slots)
        r.commit()
    st = c.stats()
    assert st.acquires == 4 and st.hits_host + st.hits_disk == 16
    assert st.blocks_h2disk > 0 and st.blocks_disk2h > 0
    assert st.bytes_d2h == st.blocks_d2h * BLOCK_BYTES
    d = st.to_dict()
    assert d["acquires"] == 4 and len(d) == len(kvtier.Stats._fields())


def test_token_mismatch_stops_the_restore(make_cache):
    c, pool = make_cache()
    t = tokens_for(4)
    keys = c.hash_tokens(t)
    with c.acquire(keys, t) as r:
        fill(pool, r.slots)
        r.commit()
    bad = t.copy()
    bad[2 * BT] += 1  # same keys, other tokens in block 2: verification refuses it
    with c.acquire(keys, bad) as r:
        assert r.info.n_restore == 2
        check(pool, r.slots[:2])
    assert c.stats().verify_mismatches == 1
    with pytest.raises(ValueError):
        c.acquire(keys, t[:-1])


def test_request_calls(make_cache):
    c, pool = make_cache(slots=16)
    t = tokens_for(6)
    keys = c.hash_tokens(t)
    r = c.acquire(keys[:4], t[: 4 * BT], extra_slots=3)
    assert r.poll() == (True, 0)
    assert r.wait(timeout=0) == 0
    assert r.layer_ready(0) and r.layer_ready(LAYERS - 1)
    r.wait_layer(1)
    fill(pool, r.slots[:6])  # decode filled two of the extra slots
    r.extend(keys[4:6], t[4 * BT:6 * BT])
    assert r.n_blocks == 6
    with pytest.raises(kvtier.KvtError) as ei:  # one extra slot is left
        r.extend(np.vstack([keys[:1], keys[:1]]))
    assert ei.value.code == -errno.EINVAL
    r.commit()
    r.release()
    with pytest.raises(kvtier.KvtError) as ei:
        r.release()
    assert ei.value.code == kvtier.ENOJOB
    res = c.lookup(keys)
    assert res.n_device == 6
    with c.acquire(keys) as r2:
        assert r2.info.n_device_hits == 6 and not r2.loading
        np.testing.assert_array_equal(r2.slots[:4], r.slots[:4])
        check(pool, r2.slots)


def test_acquire_nowait_and_nospace(make_cache):
    c, pool = make_cache(slots=4)
    keys = c.hash_tokens(tokens_for(5))
    with c.acquire(keys[:4]) as r:  # every slot pinned
        with pytest.raises(kvtier.KvtError) as ei:
            c.acquire(keys[4:], nowait=True)
        assert ei.value.code in (kvtier.ENOSPACE, kvtier.EAGAIN)
        with pytest.raises(kvtier.KvtError) as ei:
            c.acquire(keys[4:])
        assert ei.value.code == kvtier.ENOSPACE


def test_jobs(make_cache):
    c, pool = make_cache()
    keys = c.hash_tokens(tokens_for(4))
    nothing = c.store(keys)  # nothing resident: no job
    assert not nothing.started and nothing.poll() and nothing.wait() is None
    nothing.release()
    with c.acquire(keys) as r:
        fill(pool, r.slots)
        r.commit()
    job = c.store(keys)
    job.wait(timeout=None)
    assert job.poll()
    job.cancel()  # a finished job is not undone
    assert c.lookup(keys, tiers=True).n_device == 4  # copied, not evicted
    job.release()
    with pytest.raises(kvtier.KvtError) as ei:
        job.release()
    assert ei.value.code == kvtier.ENOJOB
    with pytest.raises(kvtier.KvtError) as ei:
        job.poll()
    assert ei.value.code == kvtier.ENOJOB
    assert not c.store(keys).started  # already on the host tier
    assert not c.prefetch(keys).started  # nothing on disk
    st = c.stats()
    assert st.jobs_started >= 1 and st.blocks_d2h == 4


def test_store_without_host_tier(make_cache):
    c, pool = make_cache(host_blocks=0)
    keys = c.hash_tokens(tokens_for(2))
    with c.acquire(keys) as r:
        r.commit()
    with pytest.raises(kvtier.KvtError) as ei:
        c.store(keys)
    assert ei.value.code == kvtier.EUNSUPPORTED and ei.value.call == "kvt_store"


def test_cost_model_on_a_cache(make_cache):
    c, pool = make_cache()
    # 2 layers x K,V x 1 head x 8 dims x 2 bytes x 16 tokens = the layout's 1024-byte blocks.
    m = kvtier.ModelDesc(num_layers=LAYERS, hidden_size=64, num_heads=8, num_kv_heads=1, head_dim=8,
                         intermediate_size=128, vocab_size=1000, kv_dtype_bytes=2)
    assert m.kv_bytes_per_token() * BT == BLOCK_BYTES
    with pytest.raises(kvtier.KvtError) as ei:
        c.set_cost_model(kvtier.ModelDesc.preset("llama3-8b"))
    assert ei.value.code == kvtier.ELAYOUT
    hw = kvtier.HwDesc(flops_per_gpu=1e9, mfu=0.5)
    c.set_cost_model(m, hw)
    t = tokens_for(4)
    keys = c.hash_tokens(t)
    with c.acquire(keys) as r:
        fill(pool, r.slots)
        r.commit()
    with c.store(keys, evict=True) as j:
        j.wait()
    plan = c.plan_request(keys, 4 * BT + 3)
    assert (plan.n_blocks, plan.n_prefix, plan.n_host, plan.block_tokens) == (4, 4, 4, BT)
    assert plan.decision == kvtier.Decision.RESTORE and plan.restore_blocks == 4
    assert plan.est_ttft_s < plan.est_recompute_all_s
    before = c.calibrated_hw()
    assert before.flops_per_gpu * before.mfu == pytest.approx(1e9 * 0.5)
    for _ in range(20):  # prefills much slower than the description
        c.report_prefill(0, 1024, 100.0)
    after = c.calibrated_hw()
    assert after.flops_per_gpu * after.mfu < before.flops_per_gpu * before.mfu / 2
    assert c.stats().lookups >= 1


# ---- buffers --------------------------------------------------------------

def test_memoryview_and_address_buffers(make_cache):
    slots = 8
    raw = bytearray(LAYERS * SEGS * slots * SEG_BYTES)
    view = np.frombuffer(raw, np.uint8).reshape(LAYERS, SEGS, slots, SEG_BYTES)
    with kvtier.Cache(model_fingerprint="mv", device=kvtier.Device.HOST, host_blocks=8) as c:
        mv = memoryview(raw)
        per = slots * SEG_BYTES
        segs = [(mv[i * per:(i + 1) * per], SEG_BYTES, SEG_BYTES) for i in range(LAYERS * SEGS)]
        c.register_layout(LAYERS, SEGS, slots, segs)
        _round_trip(c, view)
    addr_pool = np.zeros((LAYERS, SEGS, slots, SEG_BYTES), np.uint8)
    with kvtier.Cache(model_fingerprint="addr", device=kvtier.Device.HOST, host_blocks=8) as c:
        base = addr_pool.ctypes.data
        per = slots * SEG_BYTES
        c.register_layout(LAYERS, SEGS, slots, [kvtier.Segment(base + i * per, SEG_BYTES, SEG_BYTES)
                                                 for i in range(LAYERS * SEGS)])
        _round_trip(c, addr_pool)


def test_numpy_buffer_must_be_contiguous():
    pool = np.zeros((LAYERS, SEGS, 8, SEG_BYTES * 2), np.uint8)[..., ::2]
    with kvtier.Cache(model_fingerprint="nc", device=kvtier.Device.HOST) as c:
        with pytest.raises((BufferError, ValueError)):
            c.register_pool(pool)


def test_torch_tensor_buffers():
    torch = pytest.importorskip("torch")
    slots = 8
    pool = torch.zeros((LAYERS, SEGS, slots, SEG_BYTES // 2), dtype=torch.float16)
    with kvtier.Cache(model_fingerprint="torch", device=kvtier.Device.HOST, host_blocks=8) as c:
        c.register_pool(pool)
        assert c.block_bytes() == BLOCK_BYTES
        _round_trip(c, pool.view(torch.uint8).numpy())
        with pytest.raises(ValueError, match="contiguous"):
            kvtier._address(pool.transpose(2, 3))
        # Keys as a CPU tensor (int64 view of the uint64 keys) work too.
        keys = c.hash_tokens(tokens_for(4, seed=7))
        assert c.lookup(torch.from_numpy(keys.view(np.int64))).n_prefix == 4
        assert c.lookup(torch.from_numpy(keys.view(np.int64))[:2]).n_prefix == 2


def _round_trip(c, view):
    t = tokens_for(4, seed=7)
    keys = c.hash_tokens(t)
    with c.acquire(keys, t) as r:
        fill(view, r.slots, salt=3)
        r.commit()
    with c.store(keys, evict=True) as j:
        j.wait()
    view[:] = 0
    with c.acquire(keys, t) as r:
        assert r.wait() == 4
        check(view, r.slots, salt=3)


# ---- threads --------------------------------------------------------------

def test_threads_share_one_cache(make_cache):
    n_threads, rounds, n_blocks = 4, 25, 3
    c, pool = make_cache(slots=64, host_blocks=64, disk_blocks=128)
    errors = []

    def worker(w):
        try:
            for i in range(rounds):
                t = tokens_for(n_blocks, seed=w * 1000 + i)
                keys = c.hash_tokens(t)
                with c.acquire(keys, t) as r:
                    r.wait()
                    fill(pool, r.slots, salt=w * 1000 + i)
                    r.commit()
                with c.store(keys, evict=True) as j:
                    j.wait()
                with c.acquire(keys, t) as r:  # back from host (or disk)
                    assert r.wait() == n_blocks
                    check(pool, r.slots, salt=w * 1000 + i)
        except Exception as e:  # reported below, with the thread's name
            errors.append((w, e))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    st = c.stats()
    assert st.acquires == 2 * n_threads * rounds
    assert st.hits_host + st.hits_disk + st.hits_device == n_threads * rounds * n_blocks


# ---- contracts: sizes written back, chains, per-block states, logs, fork ----

def test_library_filled_structs_report_their_size(make_cache):
    c, _ = make_cache()
    assert c.stats()._c.size == ffi.sizeof("kvt_stats")
    plan = kvtier.cost_plan(kvtier.ModelDesc.preset("tinyllm"), kvtier.HwDesc(), 16, 100)
    assert plan._c.size == ffi.sizeof("kvt_plan")


def test_acquire_after_a_parent_continues_the_chain(make_cache):
    c, pool = make_cache()
    t = tokens_for(4)
    keys = c.hash_tokens(t)
    with c.acquire(keys[:2], t[: 2 * BT]) as r:
        fill(pool, r.slots)
        r.commit()
    tail = c.hash_tokens(t[2 * BT:], parent=keys[1])
    with c.acquire(tail, t[2 * BT:], parent=keys[1]) as r:  # cached as blocks 2, 3 of the chain
        fill(pool, r.slots, first_block=2)
        r.commit()
    assert c.lookup(keys).n_prefix == 4
    with c.acquire(keys) as r:
        assert r.info.n_device_hits == 4
        check(pool, r.slots)
    with pytest.raises(ValueError):
        c.acquire(tail, parent=keys)


def test_block_states_after_a_restore(make_cache):
    c, pool = make_cache()
    t = tokens_for(4)
    keys = c.hash_tokens(t)
    with c.acquire(keys[:2], t[: 2 * BT]) as r:
        fill(pool, r.slots)
        r.commit()
    with c.store(keys[:2], evict=True) as j:
        j.wait()
    with c.acquire(keys, t) as r:
        assert r.wait() == 2
        states = r.block_states()
        assert list(states) == [kvtier.BlockState.READY] * 2 + [kvtier.BlockState.COMPUTE] * 2
        assert list(r.block_states(1)) == [kvtier.BlockState.READY]
        check(pool, r.slots[:2])


def test_register_layout_error_names_the_path(tmp_path):
    c = kvtier.Cache(model_fingerprint="m", device=kvtier.Device.HOST, host_blocks=4,
                     disk_path=str(tmp_path / "missing-dir" / "kv.cache"), disk_blocks=8)
    with c:
        with pytest.raises(kvtier.KvtError) as ei:
            c.register_pool(np.zeros((1, 1, 4, 512), np.uint8))
        assert ei.value.code == -errno.ENOENT
        assert "missing-dir" in ei.value.detail and "missing-dir" in str(ei.value)
        assert c.error_detail() == ei.value.detail


def test_log_handler_receives_library_messages(tmp_path):
    messages = []
    path = str(tmp_path / "kv.cache")
    kvtier.set_log_handler(lambda level, msg: messages.append((level, msg)))
    try:
        for disk_blocks in (8, 16):  # reopening with another size resizes the tier, logged at INFO
            with kvtier.Cache(model_fingerprint="m", device=kvtier.Device.HOST, host_blocks=4,
                              disk_path=path, disk_blocks=disk_blocks, log_level=kvtier.LogLevel.INFO) as c:
                c.register_pool(np.zeros((1, 1, 4, 512), np.uint8))
    finally:
        kvtier.set_log_handler(None)
    assert messages, "no message from the library"
    assert all(isinstance(level, kvtier.LogLevel) and isinstance(m, str) and m for level, m in messages)
    assert any(os.path.basename(path) in m and "resized" in m and level == kvtier.LogLevel.INFO
               for level, m in messages), messages


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
def test_a_forked_child_cannot_use_the_parents_cache(make_cache):
    c, _ = make_cache()
    keys = c.hash_tokens(tokens_for(1))
    pid = os.fork()
    if pid == 0:  # the child: every call answers EFORKED
        code = 1
        try:
            c.lookup(keys)
        except kvtier.KvtError as e:
            code = 0 if e.code == kvtier.EFORKED else 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert c.lookup(keys).n_blocks == 1  # the parent's cache is unaffected


def test_package_version_is_the_library_version():
    from importlib import metadata
    try:
        assert metadata.version("kvtier") == kvtier.version()
    except metadata.PackageNotFoundError:
        pytest.skip("kvtier is not installed as a package here")
