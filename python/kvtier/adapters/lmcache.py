"""kvtier as a remote connector of LMCache 0.5.6 (external connector).

Chunks move between LMCache's own host buffers (MemoryObj from its local CPU
backend) and kvtier's tiers with no copy in Python. In the LMCache config:

    remote_url: "external://localhost:0/kvtier.adapters.lmcache/?connector_name=KvtierConnector"
    remote_serde: "naive"
    extra_config:
      kvtier: {disk_path: /nvme/kvtier.cache, disk_blocks: 100000}

The `kvtier` dict holds kvtier.Config fields. One kvtier block is one full
LMCache chunk; the namespace is the model name, world size, worker id and
dtype of LMCache's metadata.
"""

import asyncio
import hashlib
from typing import List, Optional

from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

import kvtier

from . import cache_config

_DTYPES = {"torch.float16": kvtier.Dtype.F16, "torch.bfloat16": kvtier.Dtype.BF16,
           "torch.float32": kvtier.Dtype.F32, "torch.float8_e4m3fn": kvtier.Dtype.FP8_E4M3,
           "torch.float8_e5m2": kvtier.Dtype.FP8_E5M2, "torch.uint8": kvtier.Dtype.OTHER}


class KvtierConnector(RemoteConnector):
    """RemoteConnector on kvtier's storage mode. Keys: the SHA-256 of
    CacheEngineKey.to_string() (model, world size, worker, chunk hash, dtype),
    handed to kvt_keys_from_opaque."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend, config=None):
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        md = local_cpu_backend.metadata
        extra = (config.extra_config if config is not None else None) or {}
        options, unknown = cache_config(dict(extra.get("kvtier", {})))
        if unknown:
            raise ValueError("kvtier connector: unknown options %s" % sorted(unknown))
        options.setdefault("host_blocks", 0)  # LMCache's local CPU backend is the host tier
        dtype = _DTYPES.get(str(self.meta_dtypes[0]), kvtier.Dtype.OTHER)
        fingerprint = "lmcache:%s@%d@%d" % (md.model_name, md.world_size, md.worker_id)
        self.cache = kvtier.Cache(model_fingerprint=fingerprint, dtype=dtype, device=kvtier.Device.HOST, **options)
        try:
            self.cache.register_storage(self.full_chunk_size_bytes)
        except BaseException:
            self.cache.close()
            raise
        self._names = {}  # kvtier key bytes -> CacheEngineKey string, for list()

    # Helpers --------------------------------------------------------------

    def _keys(self, keys):
        raw = [hashlib.sha256(k.to_string().encode()).digest() for k in keys]
        return self.cache.keys_from_opaque(raw)

    def _full(self, memory_obj):
        return len(memory_obj.byte_array) == self.full_chunk_size_bytes

    async def _wait(self, job):
        # The wait releases the GIL; it runs on the loop's executor, so the loop goes on.
        await asyncio.get_running_loop().run_in_executor(None, job.wait)
        res, _ = job.results()
        job.release()
        return res

    # Lookups ----------------------------------------------------------------

    async def exists(self, key) -> bool:
        return self.exists_sync(key)

    def exists_sync(self, key) -> bool:
        return self.cache.exists(self._keys([key]), opaque=True).n_prefix == 1

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List) -> int:
        if not keys:
            return 0
        return self.cache.exists(self._keys(keys), opaque=True).n_prefix

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: List, pin: bool = False) -> int:
        return self.batched_contains(keys)

    # Gets -------------------------------------------------------------------

    async def get(self, key):
        got = await self.batched_get([key])
        return got[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: List) -> List:
        """A prefix of keys comes back (kvtier loads the longest stored prefix);
        None from the first key that is not stored or failed its checksum."""
        if not keys:
            return []
        objs = []
        for _ in keys:
            mo = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes, self.meta_fmt)
            if mo is None:
                break
            objs.append(mo)
        out = [None] * len(keys)
        if objs:
            try:
                job = self.cache.get_into(self._keys(keys[:len(objs)]), [mo.byte_array for mo in objs], opaque=True)
            except kvtier.KvtError:
                job = None
            res = await self._wait(job) if job is not None else [-1] * len(objs)
            for i, mo in enumerate(objs):
                if res[i] == 0:
                    out[i] = mo
                else:
                    mo.ref_count_down()
        return out

    # Puts -------------------------------------------------------------------

    async def put(self, key, memory_obj):
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: List, memory_objs: List):
        # Partial chunks (a request's last, shorter chunk) are not stored:
        # kvtier's blocks are all one size.
        pairs = [(k, mo) for k, mo in zip(keys, memory_objs) if self._full(mo)]
        if not pairs:
            return
        kk = self._keys([k for k, _ in pairs])
        try:
            job = self.cache.put_from(kk, [mo.byte_array for _, mo in pairs], opaque=True)
        except kvtier.KvtError:
            return  # job slots busy: the chunk is simply not stored
        res = await self._wait(job)
        for i, (k, _) in enumerate(pairs):
            if res[i] in (0, 1):
                self._names[kvtier.keys_to_bytes(kk[i:i + 1])] = k.to_string()

    # Housekeeping -------------------------------------------------------------

    def remove_sync(self, key) -> bool:
        kk = self._keys([key])
        self._names.pop(kvtier.keys_to_bytes(kk), None)
        return self.cache.remove(kk) == 1

    async def list(self) -> List[str]:
        """The keys this connector stored in this process that kvtier still holds
        (kvtier keeps hashes, not LMCache's key strings, across restarts)."""
        out = []
        for raw, name in list(self._names.items()):
            if self.cache.exists(raw, opaque=True).n_prefix:
                out.append(name)
            else:
                del self._names[raw]
        return out

    async def close(self):
        if not self.cache.closed:
            self.cache.close()

    def __repr__(self) -> str:
        return "KvtierConnector(%s)" % self.cache.config.disk_path
