"""One Prometheus text of several engine replicas': each replica's samples labelled
replica="<its scheduler actor's name>", every metric family's HELP and TYPE once, its
samples from all replicas under them (what /metrics serves, with the router's gauges).

The texts are merged as lines, not parsed into families: prometheus_client's parser
splits a counter declared without its _total suffix (the engine's own lines) from its
samples, and the samples must keep their names exactly."""
from __future__ import annotations


def merge(texts: dict[str, bytes], extra: str = "") -> bytes:
    """texts: replica name -> its /metrics text; extra: more exposition text, as it is."""
    meta: dict[str, list[str]] = {}  # family -> its HELP/TYPE lines, in first-seen order
    samples: dict[str, list[str]] = {}
    for replica, text in texts.items():
        label = 'replica="' + replica.replace("\\", "\\\\").replace('"', '\\"') + '"'
        family = None
        for line in text.decode().splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                if line not in meta.setdefault(family, []):
                    meta[family].append(line)
                samples.setdefault(family, [])
            elif line and not line.startswith("#"):
                name = line.split("{", 1)[0].split(" ", 1)[0]
                key = family if family is not None and name.startswith(family) else name
                meta.setdefault(key, [])
                samples.setdefault(key, []).append(labelled(line, name, label))
    out = [line for family in meta for line in (*meta[family], *samples[family])]
    return ("\n".join(out) + "\n" + extra).encode()


def labelled(line: str, name: str, label: str) -> str:
    rest = line[len(name):]
    if rest.startswith("{}"):
        return f"{name}{{{label}}}{rest[2:]}"
    if rest.startswith("{"):
        return f"{name}{{{label},{rest[1:]}"
    return f"{name}{{{label}}}{rest}"
