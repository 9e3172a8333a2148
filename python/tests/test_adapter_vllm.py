"""kvtier.adapters.vllm driven through vLLM 0.34's own tiering classes.

The real TieringOffloadingSpec builds the real TieringOffloadingManager, its
CPU primary tier over a shared-memory region, and our tier through
SecondaryTierFactory from the config a user writes (type + module_path). The
test then makes the scheduler's calls in the scheduler's order: on_new_request,
prepare_store / complete_store (which cascades to our submit_store),
on_schedule_end (get_finished_jobs, then the batched submit_load of the
promotions that lookup started), lookup, prepare_load, get_load_source. Where
the GPU worker would copy KV into the primary tier's chunks, the test writes
known bytes into those chunks of vLLM's memoryview, and it reads them back
from the chunks vLLM names for the load: every byte is compared. No GPU and
no model run: the CPU<->GPU copies of the worker are not exercised."""

import hashlib
import os
import uuid

import numpy as np
import pytest

if os.environ.get("KVT_REQUIRE_ENGINES") != "1":
    pytest.importorskip("vllm.v1.kv_offload.tiering.spec")

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig, OffloadingModelConfig,
    OffloadingParallelConfig)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402
from vllm.v1.metrics.cache_hit_source import CacheHitSource  # noqa: E402

from kvtier.adapters.vllm import KvtierSecondaryTier  # noqa: E402

CHUNK = 4096  # bytes of one chunk (a page: vLLM aligns chunks to pages)
N_CHUNKS = 8
STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def make_spec(disk_path, reset=1, **tier):
    tier_cfg = {"type": "KvtierSecondaryTier", "module_path": "kvtier.adapters.vllm",
                "disk_path": str(disk_path), "disk_blocks": 64, "disk_reset": reset}
    tier_cfg.update(tier)
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer.0",), group_id=0),),
        worker_kv_bytes_per_block=CHUNK, enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": N_CHUNKS * CHUNK, "secondary_tiers": [tier_cfg],
                      "tier_poll_interval_s": 0},
        engine_id="kvtier-pytest-%s" % uuid.uuid4().hex[:12],
        model=OffloadingModelConfig(name="pytest/model", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1,
                                          data_parallel_rank_local=None, is_parallelism_agnostic=True))
    return TieringOffloadingSpec(config)


@pytest.fixture
def engine(tmp_path):
    made = []

    def make(reset=1, **tier):
        spec = make_spec(tmp_path / "kv.cache", reset, **tier)
        mgr = spec.get_manager()
        made.append(mgr)
        return mgr

    def close(mgr):
        made.remove(mgr)
        mgr.shutdown()

    make.close = close
    yield make
    for mgr in made:
        mgr.shutdown()


def keys_of(name, n, group=0):
    return [make_offload_key(hashlib.sha256(b"%s/%d" % (name.encode(), i)).digest(), group) for i in range(n)]


def chunk_bytes(key):
    """What the GPU worker would have written for this key's chunk."""
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, CHUNK, dtype=np.uint8)


def view_of(mgr):
    return np.frombuffer(mgr.primary_tier.get_kv_memoryview(), dtype=np.uint8).reshape(N_CHUNKS, CHUNK)


def settle(mgr):
    """Engine steps until the tiers have nothing in flight (drain_jobs is the tier's own wait)."""
    for tier in mgr.secondary_tiers:
        tier.drain_jobs()
    mgr.on_schedule_end(STEP)
    assert not mgr.has_pending_work()


def offload(mgr, req_id, keys):
    """A request's blocks stored GPU -> CPU tier, as the scheduler and worker do; the
    tiering manager then cascades them to kvtier."""
    ctx = ReqContext(req_id=req_id)
    mgr.on_new_request(ctx)
    out = mgr.prepare_store(keys, ctx)
    assert out is not None and list(out.keys_to_store) == list(keys)
    view = view_of(mgr)
    for key, chunk in zip(out.keys_to_store, out.store_spec.chunk_ids):
        view[chunk] = chunk_bytes(key)  # the worker's GPU -> CPU copy
    mgr.complete_store(keys, ctx, True)
    mgr.on_request_finished(ctx)
    mgr.on_schedule_end(STEP)
    return out


def lookup_all(mgr, ctx, keys):
    return [mgr.lookup(k, ctx) for k in keys]


def check_loaded(mgr, ctx, keys):
    spec = mgr.prepare_load(keys, ctx)
    view = view_of(mgr)
    for key, chunk in zip(keys, spec.chunk_ids):
        np.testing.assert_array_equal(view[chunk], chunk_bytes(key), err_msg="chunk of key %s" % key.hex()[:16])
    mgr.complete_load(keys, ctx)


def test_factory_builds_kvtier_tier_from_user_config(engine):
    mgr = engine()
    tier = mgr.secondary_tiers[0]
    assert isinstance(tier, KvtierSecondaryTier)
    assert tier.cache_hit_source == CacheHitSource.DISK
    assert tier.block_size_bytes == CHUNK and tier.cache.block_bytes() == CHUNK
    assert tier.tier_type == "KvtierSecondaryTier"


def test_store_cascades_then_evicted_chunks_come_back_from_kvtier(engine):
    mgr = engine()
    tier = mgr.secondary_tiers[0]
    first = keys_of("conv-a", 4)
    offload(mgr, "r1", first)
    settle(mgr)  # the cascade's put jobs finished and were reported
    assert tier.cache.exists(tier.cache.keys_from_opaque(first), opaque=True).n_disk == 4
    # Another conversation fills the CPU tier: LRU evicts the first one's chunks.
    other = keys_of("conv-b", N_CHUNKS)
    out = offload(mgr, "r2", other[:4])
    settle(mgr)
    out = offload(mgr, "r3", other[4:])
    settle(mgr)
    assert set(out.evicted_keys) == set(first)
    view_of(mgr)[:] = 0  # nothing of the first conversation is left in vLLM's memory by chance

    ctx = ReqContext(req_id="r4")
    mgr.on_new_request(ctx)
    assert mgr.primary_tier.lookup(first[0], ctx) == LookupResult.MISS
    # Primary misses, kvtier hits: the manager starts promotions (HIT_PENDING).
    assert lookup_all(mgr, ctx, first) == [LookupResult.HIT_PENDING] * 4
    mgr.on_schedule_end(STEP)  # one batched submit_load for the request
    settle(mgr)
    assert lookup_all(mgr, ctx, first) == [LookupResult.HIT] * 4
    assert {mgr.get_load_source(k, ctx) for k in first} == {CacheHitSource.DISK}
    check_loaded(mgr, ctx, first)
    mgr.on_request_finished(ctx)
    assert lookup_all(mgr, ReqContext(req_id="r5"), keys_of("never", 2)) == [LookupResult.MISS] * 2


def test_store_of_keys_already_in_kvtier_succeeds_without_rewriting(engine):
    mgr = engine()
    tier = mgr.secondary_tiers[0]
    keys = keys_of("dup", 2)
    offload(mgr, "r1", keys)
    settle(mgr)
    # The same keys offered to the tier again (a request-level tier or a second cascade).
    meta = mgr.create_store_job(keys, ReqContext(req_id="r2"), 0)
    tier.submit_store(meta)
    tier.drain_jobs()
    results = list(tier.get_finished_jobs())
    assert [(r.job_id, r.success, r.transfer_bytes) for r in results] == [(meta.job_id, True, 0)]
    mgr.primary_tier.complete_read(keys, meta.req_context)


def test_partial_load_reports_successful_keys(engine):
    mgr = engine()
    tier = mgr.secondary_tiers[0]
    keys = keys_of("partial", 3)
    offload(mgr, "r1", keys)
    settle(mgr)
    for i, other in enumerate((keys_of("fill", N_CHUNKS)[:4], keys_of("fill", N_CHUNKS)[4:])):
        offload(mgr, "f%d" % i, other)
        settle(mgr)
    ctx = ReqContext(req_id="r2")
    mgr.on_new_request(ctx)
    assert lookup_all(mgr, ctx, keys) == [LookupResult.HIT_PENDING] * 3
    # Between the lookup and the load, kvtier loses the middle block.
    assert tier.cache.remove(tier.cache.keys_from_opaque(keys[1:2])) == 1
    mgr.on_schedule_end(STEP)
    tier.drain_jobs()
    results = list(tier.get_finished_jobs())
    assert len(results) == 1 and not results[0].success
    # Keys load as a consecutive prefix: only keys[0] landed.
    assert list(results[0].successful_keys) == [keys[0]]
    assert results[0].transfer_bytes == CHUNK
    # Hand the result to the manager as its own poll would have.
    mgr._complete_promotion(mgr._pop_job(results[0].job_id), results[0])
    assert mgr.lookup(keys[0], ctx) == LookupResult.HIT
    check_loaded(mgr, ctx, keys[:1])
    assert mgr.primary_tier.lookup(keys[1], ctx) == LookupResult.MISS
    mgr.on_request_finished(ctx)


def test_restart_finds_the_blocks_on_disk(engine):
    mgr = engine()
    keys = keys_of("restart", 5)
    offload(mgr, "r1", keys)
    settle(mgr)
    engine.close(mgr)  # shuts the manager down: the tier closes its kvtier cache
    fresh = engine(reset=0)  # another vLLM process, same disk
    ctx = ReqContext(req_id="r2")
    fresh.on_new_request(ctx)
    assert lookup_all(fresh, ctx, keys) == [LookupResult.HIT_PENDING] * 5
    fresh.on_schedule_end(STEP)
    settle(fresh)
    assert lookup_all(fresh, ctx, keys) == [LookupResult.HIT] * 5
    check_loaded(fresh, ctx, keys)
    fresh.on_request_finished(ctx)


def test_unknown_tier_option_is_refused(tmp_path):
    spec = make_spec(tmp_path / "kv.cache", not_an_option=1)
    with pytest.raises(ValueError, match="not_an_option"):
        spec.get_manager()
