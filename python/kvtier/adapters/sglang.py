"""kvtier as a HiCache storage backend of SGLang 0.5.23 (L3 under its host pool).

Pages move zero-copy between SGLang's host KV pool (the pointers of
get_page_buffer_meta) and kvtier's tiers; page keys are SGLang's own
SHA-256 page hashes. Launch with:

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
      "module_path": "kvtier.adapters.sglang", "class_name": "KvtierHiCacheStorage",
      "interface_v1": 1, "disk_path": "/nvme/kvtier.cache", "disk_blocks": 200000}'

Other keys of the extra config that name kvtier.Config fields (host_blocks,
copy_threads, disk_backend, ...) reach kvtier; the rest are SGLang's.
"""

import hashlib
import time
from typing import Any, List, Optional

import numpy as np
import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

import kvtier

from . import cache_config

_DTYPES = {torch.float16: kvtier.Dtype.F16, torch.bfloat16: kvtier.Dtype.BF16, torch.float32: kvtier.Dtype.F32,
           torch.float8_e4m3fn: kvtier.Dtype.FP8_E4M3, torch.float8_e5m2: kvtier.Dtype.FP8_E5M2,
           torch.int8: kvtier.Dtype.INT8, torch.uint8: kvtier.Dtype.OTHER}


def _key_bytes(key):
    """SGLang's page key (64 hex digits of SHA-256) as its 32 bytes; any other
    string (a backend suffix, a test key) as the SHA-256 of its text."""
    if len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(key.encode()).digest()


class KvtierHiCacheStorage(HiCacheStorage):
    """HiCacheStorage on kvtier's storage mode: one kvtier block per SGLang page,
    its pieces the page's buffers as the host pool lays them out."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        extra = dict(storage_config.extra_config or {})
        self._options, _ = cache_config(extra)
        self.cache = None
        self.mem_pool_host = None
        self._pieces_per_page = 0
        self._metrics = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [], "backup_bandwidth": []}
        if kwargs and kwargs.get("mem_pool_host") is not None:
            self.register_mem_pool_host(kwargs["mem_pool_host"])

    # Setup -----------------------------------------------------------------

    def _namespace(self, pool):
        cfg = self.storage_config
        name = "sglang:%s" % (cfg.model_name or "model")
        if cfg.is_mla_model:
            name += ":mla"  # every TP rank holds the same latent: one namespace for all
        else:
            name += ":pp%d/%d:cp%d/%d:dp%d" % (cfg.pp_rank, cfg.pp_size, cfg.attn_cp_rank, cfg.attn_cp_size,
                                              cfg.dp_rank)
        out = {"model_fingerprint": name, "dtype": _DTYPES.get(getattr(pool, "dtype", None), kvtier.Dtype.OTHER)}
        if not cfg.is_mla_model:
            out["tp_rank"], out["tp_size"] = cfg.tp_rank, max(1, cfg.tp_size)
        return out

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        if self.cache is not None:
            return
        ptrs, sizes = mem_pool_host.get_page_buffer_meta(torch.arange(mem_pool_host.page_size, dtype=torch.int64))
        self._pieces_per_page = len(ptrs)
        self.cache = kvtier.Cache(device=kvtier.Device.HOST, **{**self._namespace(mem_pool_host), **self._options})
        try:
            self.cache.register_storage([int(s) for s in sizes], num_layers=1, segments_per_layer=len(sizes))
        except BaseException:
            self.cache.close()
            raise

    def _keys(self, keys):
        return self.cache.keys_from_opaque([_key_bytes(k) for k in keys])

    def _page_pieces(self, host_indices):
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        return kvtier.pieces(np.asarray(sizes, dtype=np.uint64), addresses=np.asarray(ptrs, dtype=np.uint64))

    def _run(self, kind, keys, pieces):
        t0 = time.perf_counter()
        fn = self.cache.put_from if kind == "put" else self.cache.get_into
        try:
            job = fn(self._keys(keys), pieces, opaque=True)
        except kvtier.KvtError:
            return [False] * len(keys)  # job slots busy: SGLang retries or recomputes
        with job:
            job.wait()
            res, _ = job.results()
        ok = [(r == 0 or (kind == "put" and r == 1)) for r in res.tolist()]
        seconds = time.perf_counter() - t0
        pages = sum(ok)
        name = "backup" if kind == "put" else "prefetch"
        self._metrics[name + "_pgs"].append(pages)
        if seconds > 0:
            self._metrics[name + "_bandwidth"].append(pages * self.cache.block_bytes() / seconds / 1e9)
        return ok

    # Zero-copy interface (interface_v1) ---------------------------------------

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        if not keys:
            return 0
        return self.cache.exists(self._keys(keys), opaque=True).n_prefix

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor, extra_info=None) -> List[bool]:
        if not keys:
            return []
        return self._run("put", keys, self._page_pieces(host_indices))

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor, extra_info=None) -> List[bool]:
        if not keys:
            return []
        return self._run("get", keys, self._page_pieces(host_indices))

    # Tensor interface ---------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def _tensor_pieces(self, tensors):
        return [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value] if value is not None else None,
                               [target_location] if target_location is not None else None)

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """values: one contiguous CPU tensor of a page's bytes per key (or
        target_locations: host pool indices of each page)."""
        if values is None:
            if target_locations is None:
                return False
            idx = torch.cat([torch.as_tensor(t).reshape(-1) for t in target_locations])
            return all(self.batch_set_v1(keys, idx))
        values = [v.contiguous() for v in values]
        if any(v.numel() * v.element_size() != self.cache.block_bytes() for v in values):
            raise ValueError("kvtier: each value must hold one page (%d bytes)" % self.cache.block_bytes())
        return all(self._run("put", keys, self._tensor_pieces(values)))

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        got = self.batch_get([key], [target_location] if target_location is not None else None)
        return got[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None):
        """Into target_locations (contiguous CPU tensors of one page each), or
        into new uint8 tensors; None for a page that is not stored."""
        if target_locations is None:
            target_locations = [torch.empty(self.cache.block_bytes(), dtype=torch.uint8) for _ in keys]
        ok = self._run("get", keys, self._tensor_pieces(target_locations))
        return [t if good else None for t, good in zip(target_locations, ok)]

    # Housekeeping -------------------------------------------------------------

    def delete(self, key: str) -> None:
        self.cache.remove(self._keys([key]))

    def clear(self) -> None:
        """Drops every page this backend stored: a fresh cache on the same disk, reset."""
        if self.cache is None:
            return
        pool = self.mem_pool_host
        self.cache.close()
        self.cache = None
        self._options["disk_reset"] = 1
        self.register_mem_pool_host(pool)

    def get_stats(self):
        from sglang.srt.observability.metrics_collector import StorageMetrics
        m = StorageMetrics(**self._metrics)
        self._metrics = {k: [] for k in self._metrics}
        return m

    def kvtier_stats(self):
        """kvtier's own counters (hits per tier, bytes moved, checksum failures...)."""
        return self.cache.stats().to_dict()

    def close(self):
        if self.cache is not None:
            self.cache.close()
