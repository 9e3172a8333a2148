"""kvtier's metrics in a prometheus_client registry.

    from prometheus_client import REGISTRY, start_http_server
    from kvtier.prometheus import KvtierCollector

    REGISTRY.register(KvtierCollector(cache))
    start_http_server(9400)

Each scrape reads the cache once (Cache.metrics("json"), which takes the
cache's lock briefly) and yields the same families, names and labels as
kvt_metrics_write's text (docs/metrics.md). Needs prometheus_client
(pip install prometheus_client); kvtier itself does not.
"""

import json

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

__all__ = ["KvtierCollector"]

# Label names of kvtier's own samples (docs/metrics.md), and the histogram's.
_OWN_LABELS = frozenset(("version", "device_backend", "disk_backend", "counting", "tier", "reason", "src", "dst",
                         "kind", "decision", "le"))


class KvtierCollector:
    """A prometheus_client collector over one or more kvtier caches. With
    several, pass labels={"cache": ...} per cache through add(); families
    are merged so each name appears once."""

    def __init__(self, cache=None, labels=None):
        self._caches = []
        if cache is not None:
            self.add(cache, labels)

    def add(self, cache, labels=None):
        """Adds a cache whose samples carry the extra constant labels. Every
        cache of one collector needs the same label names with values that
        tell it apart, none of them a name kvtier uses itself (ValueError
        otherwise: the scrape would hold duplicate series)."""
        labels = dict(labels or {})
        clash = _OWN_LABELS.intersection(labels)
        if clash:
            raise ValueError("label %s is kvtier's own" % ", ".join(sorted(clash)))
        for _, other in self._caches:
            if set(other) != set(labels):
                raise ValueError("every cache needs the same extra label names: %s, not %s"
                                 % (sorted(other) or "none", sorted(labels) or "none"))
            if other == labels:
                raise ValueError("another cache already has labels %r" % (labels,))
        self._caches.append((cache, labels))

    def describe(self):
        return []  # families are known only once a cache is read: no check at register time

    def collect(self):
        families = {}
        for cache, extra in self._caches:
            if cache.closed:
                continue
            for fam in json.loads(cache.metrics("json"))["metrics"]:
                for s in fam["samples"]:
                    labels = dict(s["labels"], **extra)
                    out = families.get(fam["name"])
                    if out is None:
                        out = families[fam["name"]] = _family(fam, sorted(labels))
                    values = [labels[k] for k in sorted(labels)]
                    if fam["type"] == "histogram":
                        buckets = [(b["le"], b["count"]) for b in s["buckets"]]
                        out.add_metric(values, buckets, s["sum"])
                    else:
                        out.add_metric(values, s["value"])
        return iter(families.values())


def _family(fam, label_names):
    kind = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}
    return kind[fam["type"]](fam["name"], fam["help"], labels=label_names)
