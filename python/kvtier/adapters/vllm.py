"""kvtier as a secondary tier of vLLM 0.34's tiering offloading spec.

vLLM keeps its own CPU tier (the primary tier: a shared-memory region of
chunks); this tier sits under it and moves chunks of that region straight to
kvtier's tiers (an optional host pool, then disk) and back, with no copy in
Python. Configure it in kv_transfer_config:

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 10737418240,
        "secondary_tiers": [{"type": "KvtierSecondaryTier",
                             "module_path": "kvtier.adapters.vllm",
                             "disk_path": "/nvme/kvtier.cache", "disk_blocks": 100000}]}}'

Every other key of the tier's dict is a kvtier.Config field (disk_blocks,
host_blocks, copy_threads, disk_backend, ...). The namespace (model, dtype,
rank) comes from vLLM's offloading config unless given.

Hits are reported as CacheHitSource.DISK (medium STORAGE), so vLLM's
per-source prefix-cache metrics count them; kvtier's own figures come from
kvtier.prometheus.KvtierCollector(tier.cache).
"""

import time
from typing import Any, ClassVar

import numpy as np

from vllm.v1.kv_offload.base import LookupResult, Medium, RequestOffloadingContext
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager

import kvtier

from . import cache_config, open_cache

_DTYPES = {"float16": kvtier.Dtype.F16, "half": kvtier.Dtype.F16, "bfloat16": kvtier.Dtype.BF16,
           "float32": kvtier.Dtype.F32, "float": kvtier.Dtype.F32, "fp8": kvtier.Dtype.FP8_E4M3,
           "fp8_e4m3": kvtier.Dtype.FP8_E4M3, "fp8_e5m2": kvtier.Dtype.FP8_E5M2}


def _namespace_defaults(spec):
    """kvtier.Config fields that vLLM's offloading config determines."""
    out = {"model_fingerprint": "vllm"}
    config = getattr(spec, "config", None)
    if config is None:
        return out
    model = getattr(config, "model", None)
    if model is not None:
        out["model_fingerprint"] = "vllm:%s" % model.name
        dtype = str(model.dtype).replace("torch.", "")
        out["dtype"] = _DTYPES.get(dtype, kvtier.Dtype.OTHER)
    parallel = getattr(config, "parallel", None)
    if parallel is not None:
        # The scheduler's chunks hold every worker's bytes: one namespace per topology.
        out["tp_size"] = max(1, parallel.world_size)
    return out


class _Pending:
    __slots__ = ("meta", "job", "keys", "submitted")

    def __init__(self, meta, job, keys):
        self.meta, self.job, self.keys = meta, job, keys
        self.submitted = time.monotonic()


class KvtierSecondaryTier(SecondaryTierManager):
    """SecondaryTierManager on kvtier's storage mode: one kvtier block per
    vLLM chunk, keyed by the OffloadKey's bytes (kvt_keys_from_opaque)."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector=None, **tier_config: Any) -> None:
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                         tier_type=tier_type, backpressure_detector=backpressure_detector)
        options, unknown = cache_config(tier_config)
        unknown.pop("locality", None)
        if unknown:
            raise ValueError("kvtier tier: unknown options %s" % sorted(unknown))
        options.setdefault("host_blocks", 0)  # vLLM's CPU tier is the host tier
        self.cache = open_cache(self.block_size_bytes, _namespace_defaults(offloading_spec), options)
        try:
            self._region = self.cache.register_memory(primary_kv_view)
        except BaseException:
            self.cache.close()
            raise
        self._jobs = {}      # kvtier job handle -> _Pending
        self._failed = []    # JobResults of jobs kvtier refused at submit
        self._storing = {}   # OffloadKey -> stores in flight carrying it

    # Helpers --------------------------------------------------------------

    def _pieces(self, chunk_ids):
        offsets = np.asarray(chunk_ids, dtype=np.uint64) * np.uint64(self.block_size_bytes)
        return kvtier.pieces(self.block_size_bytes, region=self._region, offsets=offsets)

    def _submit(self, meta, kind):
        keys = list(meta.keys)
        if len(keys) != len(meta.chunk_ids):
            raise ValueError("job %d: %d keys for %d chunks" % (meta.job_id, len(keys), len(meta.chunk_ids)))
        if not keys:
            self._failed.append(JobResult(job_id=meta.job_id, success=True, transfer_time=0.0, transfer_bytes=0))
            return
        kkeys = self.cache.keys_from_opaque(keys)
        try:
            if kind == "put":
                job = self.cache.put_from(kkeys, self._pieces(meta.chunk_ids), opaque=True)
            else:
                job = self.cache.get_into(kkeys, self._pieces(meta.chunk_ids), opaque=True)
        except kvtier.KvtError:
            # Every job slot busy (EAGAIN) or a refused batch: the job fails, vLLM carries on.
            self._failed.append(JobResult(job_id=meta.job_id, success=False, successful_keys=None))
            return
        self._jobs[job.handle] = _Pending(meta, job, keys)
        if kind == "put":
            for k in keys:
                self._storing[k] = self._storing.get(k, 0) + 1

    def _finish(self, pending, status):
        job, meta = pending.job, pending.meta
        got = job.results()
        res = got[0] if got is not None else np.full(len(pending.keys), status or -1, np.int32)
        job.release()
        elapsed = time.monotonic() - pending.submitted
        moved = int(np.count_nonzero(res == 0)) * self.block_size_bytes
        if job.kind == "put":
            for k in pending.keys:
                n = self._storing.pop(k, 0) - 1
                if n > 0:
                    self._storing[k] = n
            ok = bool(np.all((res == 0) | (res == 1)))  # 1: already stored
            return JobResult(job_id=meta.job_id, success=ok, transfer_time=elapsed, transfer_bytes=moved)
        landed = res == 0
        if landed.all():
            return JobResult(job_id=meta.job_id, success=True, transfer_time=elapsed, transfer_bytes=moved)
        # Partial: the keys that landed are usable; the rest (missing, I/O
        # error, checksum) fail and vLLM recomputes them. The job is over, so
        # nothing writes into their chunks any more: no deferred release.
        good = [k for k, ok in zip(pending.keys, landed) if ok]
        return JobResult(job_id=meta.job_id, success=False, successful_keys=good,
                         transfer_time=elapsed, transfer_bytes=moved)

    # SecondaryTierManager ---------------------------------------------------

    def lookup(self, key, req_context):
        if self.cache.exists(self.cache.keys_from_opaque([key]), opaque=True).n_prefix:
            return LookupResult.HIT
        if key in self._storing:
            return LookupResult.RETRY
        return LookupResult.MISS

    def submit_store(self, job_metadata) -> None:
        self._submit(job_metadata, "put")

    def submit_load(self, job_metadata) -> None:
        self._submit(job_metadata, "get")

    def get_finished_jobs(self):
        out, self._failed = self._failed, []
        for job, status in self.cache.storage_collect():
            pending = self._jobs.pop(job.handle, None)
            if pending is None:  # not ours (another user of this cache)
                continue
            out.append(self._finish(pending, status))
        return out

    def has_pending_work(self) -> bool:
        return bool(self._jobs or self._failed)

    def on_new_request(self, req_context):
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        # Each job is waited on by its handle; its result stays queued for
        # get_finished_jobs (kvt_storage_collect still reports it).
        for pending in list(self._jobs.values()):
            pending.job.wait()

    def shutdown(self) -> None:
        if not self.cache.closed:
            self.drain_jobs()
            self.cache.close()
