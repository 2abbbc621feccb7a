"""NUMA topology: nodes, their CPUs and the distances between them.

Read from Linux sysfs (``/sys/devices/system/node/nodeN/cpulist`` and
``.../distance``), from a fake tree of the same shape, or from a JSON file::

    {"nodes": {"0": "0-17", "1": [18, 19, ...]}, "distances": [[10, 15, ...], ...]}

so placement can be tried for a machine we do not have (the Bullion S16 of
the UPM-CEP paper: ``tests/runtime/data/bullion_s16.json``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from sparkcep.errors import EngineError

SYSFS = "/sys/devices/system/node"


MAX_CPU = 65_535  # past any machine's CPU numbers: a typo'd range is not expanded


def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> [0, 1, 2, 3, 8, 10, 11] (sysfs' format; empty: none); ValueError naming
    ``text`` when it is not one."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, dash, last = (x.strip() for x in part.partition("-"))
        if not (first.isdecimal() and (last.isdecimal() or not dash)) or int(last or first) > MAX_CPU \
                or int(last or first) < int(first):
            raise ValueError(f"expected CPUs as in 3, 0-3 or 0-1,4 (numbers up to {MAX_CPU:,}, each range "
                             f"ascending), got {text!r}")
        out.extend(range(int(first), int(last or first) + 1))
    return out


@dataclass
class Topology:
    """``nodes[n]``: the CPUs of node ``n``; ``distances[i][j]``: relative memory latency (10 = local)."""

    nodes: dict[int, list[int]]
    distances: list[list[int]]
    source: str = ""

    def __post_init__(self):
        ids = sorted(self.nodes)
        if ids != list(range(len(ids))):
            raise EngineError(f"topology {self.source}: nodes must be numbered 0..N-1, got {ids}", "TOPOLOGY")
        if len(self.distances) != len(ids) or any(len(row) != len(ids) for row in self.distances):
            raise EngineError(f"topology {self.source}: the distance table must be {len(ids)}x{len(ids)}",
                              "TOPOLOGY")
        self._node_of = {c: n for n, cpus in self.nodes.items() for c in cpus}

    @classmethod
    def from_sysfs(cls, root: str | os.PathLike = SYSFS, allowed: set[int] | None = None) -> "Topology":
        """The topology under ``root`` (a real or fake sysfs node directory).

        ``allowed``: keep only these CPUs (default for the real tree: the CPUs
        this process may run on). Without a node directory: one node holding
        the allowed CPUs.
        """
        root = Path(root)
        real = str(root) == SYSFS
        if allowed is None and real:
            allowed = set(os.sched_getaffinity(0))
        dirs = sorted((d for d in root.glob("node[0-9]*") if d.name[4:].isdecimal()), key=lambda d: int(d.name[4:]))
        if not dirs:
            if not real:
                raise EngineError(f"no node directories under {root}", "TOPOLOGY")
            return cls({0: sorted(allowed or os.sched_getaffinity(0))}, [[10]], source="(no sysfs: one node)")
        nodes, dist = {}, []
        for i, d in enumerate(dirs):
            cpus = parse_cpulist((d / "cpulist").read_text())
            nodes[i] = [c for c in cpus if allowed is None or c in allowed]
            dist.append([int(x) for x in (d / "distance").read_text().split()])
        return cls(nodes, dist, source=str(root))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Topology":
        """A JSON topology file, or a directory laid out like sysfs."""
        path = Path(path)
        if path.is_dir():
            return cls.from_sysfs(path)
        try:
            spec = json.loads(path.read_text())
            nodes = {int(n): parse_cpulist(c) if isinstance(c, str) else [int(x) for x in c]
                     for n, c in spec["nodes"].items()}
            return cls(nodes, [[int(x) for x in row] for row in spec["distances"]], source=str(path))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise EngineError(f"cannot read topology file {path}: {e}", "TOPOLOGY") from None

    @classmethod
    def load(cls, spec=None) -> "Topology":
        """``None``: this machine; a path: :meth:`from_file`; a Topology: itself."""
        if spec is None:
            return cls.from_sysfs()
        if isinstance(spec, Topology):
            return spec
        return cls.from_file(spec)

    def node_of(self, cpu: int) -> int:
        return self._node_of[cpu]

    def distance(self, a: int, b: int) -> int:
        return self.distances[a][b]

    def by_distance(self, node: int) -> list[int]:
        """Nodes from nearest to farthest from ``node`` (itself first)."""
        return sorted(self.nodes, key=lambda n: (self.distances[node][n], n))

    @property
    def cpus(self) -> list[int]:
        return [c for n in sorted(self.nodes) for c in self.nodes[n]]


def pin(cpus: list[int]) -> None:
    """Pin this process to ``cpus`` (EngineError PIN when one is not available)."""
    try:
        os.sched_setaffinity(0, set(cpus))
    except OSError as e:
        raise EngineError(f"cannot pin to cpu {','.join(map(str, cpus))}: {e}; cpus available: "
                          f"{sorted(os.sched_getaffinity(0))}", "PIN") from None


def prefer_node(node: int | None) -> bool:
    """Ask libnuma to allocate this process's memory on ``node``; False when it cannot."""
    if node is None:
        return False
    name = ctypes.util.find_library("numa")
    if not name:
        return False
    try:
        numa = ctypes.CDLL(name)
        if numa.numa_available() < 0 or node > numa.numa_max_node():
            return False  # a missing node would print "mbind: Invalid argument" and bind nothing
        numa.numa_set_preferred(ctypes.c_int(node))
        return True
    except (OSError, AttributeError):
        return False
