"""One Prometheus text of several engine replicas': each replica's samples labelled
replica="<its scheduler actor's name>", every metric family once, plus the router's own
gauges (what /metrics serves)."""
from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


class _Families:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self):
        return self.families


def merge(texts: dict[str, bytes], router_gauges: list[GaugeMetricFamily] = ()) -> bytes:
    """texts: replica name -> its /metrics text."""
    merged: dict[str, Metric] = {}
    for replica, text in texts.items():
        for family in text_string_to_metric_families(text.decode()):
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            into.samples.extend(Sample(s.name, {**s.labels, "replica": replica}, s.value, s.timestamp, s.exemplar)
                                for s in family.samples)
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*merged.values(), *router_gauges]))
    return generate_latest(registry)
