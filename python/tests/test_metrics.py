"""Cache.metrics (kvt_metrics_write) and the prometheus_client collector: the
text parses with prometheus_client's own parser (when it is installed), the
JSON says the same, and the counters are what the test did."""

import json

import numpy as np
import pytest

import kvtier
from conftest import BT, check, fill, tokens_for


def _run(c, pool, keys, tokens, n_restore):
    """One request: restore n_restore blocks, compute the rest, commit, release."""
    with c.acquire(keys, tokens, restore=n_restore) as req:
        ready = req.wait()
        check(pool, req.slots[:ready])
        fill(pool, req.slots[ready:len(keys)], first_block=ready)
        req.commit()
    return ready


def _samples(text):
    """name{labels} -> value, with prometheus_client's parser when present, else by hand."""
    out = {}
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        for line in text.splitlines():
            if not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join('%s="%s"' % kv for kv in s.labels.items())
            out[s.name + ("{%s}" % labels if labels else "")] = s.value
    return out


def test_metrics_count_what_the_cache_did(make_cache):
    c, pool = make_cache(slots=16, host_blocks=16)
    tokens = tokens_for(4)
    keys = c.hash_tokens(tokens)
    assert _run(c, pool, keys, tokens, 4) == 0  # 4 absent
    assert _run(c, pool, keys, tokens, 4) == 4  # 4 device hits
    with c.store(keys, evict=True) as job:
        job.wait()
    assert _run(c, pool, keys, tokens, 2) == 2  # 2 host hits, 2 planned recomputes
    c.drain()
    s = _samples(c.metrics())
    assert s['kvtier_hit_blocks_total{tier="device"}'] == 4
    assert s['kvtier_hit_blocks_total{tier="host"}'] == 2
    assert s['kvtier_hit_tokens_total{tier="host"}'] == 2 * BT
    assert s['kvtier_miss_blocks_total{reason="absent"}'] == 4
    assert s['kvtier_miss_blocks_total{reason="planned_recompute"}'] == 2
    assert s['kvtier_transfer_blocks_total{src="device",dst="host"}'] == 4
    assert s['kvtier_transfer_seconds_count{src="device",dst="host"}'] == 1
    assert s['kvtier_capacity_blocks{tier="host"}'] == 16
    assert s["kvtier_acquires_total"] == 3
    doc = json.loads(c.metrics("json"))
    fams = {f["name"]: f for f in doc["metrics"]}
    hits = {smp["labels"]["tier"]: smp["value"] for smp in fams["kvtier_hit_blocks_total"]["samples"]}
    assert hits == {"device": 4, "host": 2, "disk": 0}
    assert doc["version"] == kvtier.version()
    with pytest.raises(KeyError):
        c.metrics("xml")


def test_prometheus_client_collector(make_cache):
    prom = pytest.importorskip("prometheus_client")
    from kvtier.prometheus import KvtierCollector

    a, pool_a = make_cache(slots=8, host_blocks=8)
    b, _ = make_cache(slots=8, host_blocks=8)
    tokens = tokens_for(3)
    keys = a.hash_tokens(tokens)
    _run(a, pool_a, keys, tokens, 3)
    _run(a, pool_a, keys, tokens, 3)  # 3 device hits in cache a, none in b
    registry = prom.CollectorRegistry()
    collector = KvtierCollector()
    collector.add(a, {"cache": "a"})
    collector.add(b, {"cache": "b"})
    registry.register(collector)
    text = prom.generate_latest(registry).decode()
    s = _samples(text)
    assert s['kvtier_hit_blocks_total{cache="a",tier="device"}'] == 3
    assert s['kvtier_hit_blocks_total{cache="b",tier="device"}'] == 0
    assert s['kvtier_acquires_total{cache="a"}'] == 2
    inf = s['kvtier_transfer_seconds_bucket{cache="a",dst="host",le="+Inf",src="device"}']
    assert inf == s['kvtier_transfer_seconds_count{cache="a",dst="host",src="device"}']
    assert registry.get_sample_value("kvtier_lookups_total", {"cache": "a"}) == 0
    # The library's own text parses with prometheus_client's parser as well.
    own = _samples(a.metrics())
    assert own['kvtier_hit_blocks_total{tier="device"}'] == 3
    assert np.isclose(own['kvtier_info{version="%s",device_backend="host",disk_backend="none",counting="on"}'
                          % kvtier.version()], 1)


def test_collector_refuses_labels_that_would_duplicate_series(make_cache):
    pytest.importorskip("prometheus_client")
    from kvtier.prometheus import KvtierCollector

    a, _ = make_cache(slots=8, host_blocks=8)
    b, _ = make_cache(slots=8, host_blocks=8)
    # A cache without labels, then one with: the second's label would be dropped.
    collector = KvtierCollector(a)
    with pytest.raises(ValueError):
        collector.add(b, {"cache": "b"})
    # Two caches with the same labels: every series twice.
    collector = KvtierCollector()
    collector.add(a, {"cache": "x"})
    with pytest.raises(ValueError):
        collector.add(b, {"cache": "x"})
    # A label kvtier uses itself would overwrite it (three tier="x" series).
    with pytest.raises(ValueError):
        KvtierCollector(a, {"tier": "x"})
    collector.add(b, {"cache": "y"})
    assert len(list(collector.collect())) > 0
