"""kvtier under Python inference engines: one module per engine.

    kvtier.adapters.vllm     vLLM 0.34 tiering spec: a secondary tier under vLLM's CPU tier
    kvtier.adapters.sglang   SGLang 0.5.23 HiCache storage backend (dynamic, interface_v1)
    kvtier.adapters.lmcache  LMCache 0.5.6 remote connector (external://)

Each module imports its engine, so import only the one you run. All of them
sit on storage mode (Cache.register_storage, put_from, get_into, exists):
the engine keeps its memory and kvtier copies blocks straight to and from it.
"""

# Config keys every adapter passes through to kvtier.Config (others are the adapter's own).
CACHE_KEYS = ("model_fingerprint", "tp_rank", "tp_size", "tenant_salt", "copy_threads", "host_blocks",
              "host_mlock", "disk_path", "disk_blocks", "disk_queue_depth", "disk_backend", "disk_reset",
              "write_policy", "max_jobs", "max_job_blocks", "disk_durable", "log_level")


def cache_config(options):
    """Splits adapter options into kvtier.Config fields and the rest."""
    cfg = {k: options[k] for k in CACHE_KEYS if k in options}
    rest = {k: v for k, v in options.items() if k not in CACHE_KEYS}
    return cfg, rest


def open_cache(block_bytes, defaults, options):
    """A storage-mode kvtier.Cache for blocks of block_bytes: defaults (the
    engine's namespace inputs) overridden by the user's options. Engines
    hand kvtier their own keys, so block_tokens only sizes the record."""
    import kvtier
    cfg = dict(defaults)
    cfg.update(options)
    cfg.setdefault("device", kvtier.Device.HOST)
    cache = kvtier.Cache(**cfg)
    try:
        cache.register_storage(block_bytes)
    except BaseException:
        cache.close()
        raise
    return cache
