"""Balancers (UPM-CEP §4.1): how one edge spreads batches over the target's instances.

* point-to-point: one target instance gets everything;
* round-robin: batches rotate over the instances, cut into one slice per
  instance (of at least ``MIN_SLICE_ROWS``, at most ``SLICE_ROWS`` rows), so
  that every instance works on a batch at once;
* route-key: hash of the key fields -> bin -> instance through the bin table,
  the table migration changes at run time;
* broadcast: every instance gets every batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import pyarrow as pa

from sparkcep.core import columns
from sparkcep.core.partition import destinations
from sparkcep.query.planner import BROADCAST, POINT_TO_POINT, ROUND_ROBIN, ROUTE_KEY, Edge
from sparkcep.runtime.bins import BinTable
from sparkcep.runtime.channels import Configure, Control, Producer

SLICE_ROWS = 32_768  # round-robin cuts batches into slices of at most this many rows (a HiBench
# fixwindow instance manager took 6-9% less CPU a record than with 16K-row slices: fewer calls a record)
MIN_SLICE_ROWS = 2_048  # and of at least this many: smaller ones cost more per row than they save


class Balancer(ABC):
    #: its parts never share memory with the batch they come from
    copies = False

    def __init__(self, instances: int):
        self.instances = instances

    @abstractmethod
    def split(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        """(target instance, rows) pairs covering the batch."""


class PointToPoint(Balancer):
    def split(self, batch):
        return [(0, batch)]


class RoundRobin(Balancer):
    def __init__(self, instances: int):
        super().__init__(instances)
        self.next = 0

    def split(self, batch):
        n = batch.num_rows
        rows = min(SLICE_ROWS, max(MIN_SLICE_ROWS, -(-n // self.instances)))
        out = []
        for start in range(0, max(n, 1), rows):
            out.append((self.next, batch.slice(start, rows)))
            self.next = (self.next + 1) % self.instances
        return out


class Broadcast(Balancer):
    def split(self, batch):
        return [(i, batch) for i in range(self.instances)]


class RouteKey(Balancer):
    """Routes each row to the owner of its key's bin in ``table`` (shared with the router's other
    edges into the same operator, and changed by Configure records)."""

    copies = True

    def __init__(self, keys: list[str], table: BinTable):
        super().__init__(table.instances)
        self.keys, self.table = keys, table

    def split(self, batch):
        order, starts = destinations(*columns.encode_keys(batch, self.keys), self.table.owners, self.instances)
        taken = columns.take(batch, order)
        return [(i, taken.slice(starts[i], starts[i + 1] - starts[i])) for i in range(self.instances)
                if starts[i + 1] > starts[i]]


def balancer_for(edge: Edge, instances: int, tables: dict[str, BinTable]) -> Balancer:
    """The balancer of ``edge`` into a sub-query running ``instances`` instances."""
    if edge.balancer == BROADCAST:
        return Broadcast(instances)
    if instances == 1 or edge.balancer == POINT_TO_POINT:
        return PointToPoint(instances)
    if edge.balancer == ROUTE_KEY:
        return RouteKey(edge.keys, tables[edge.dst.name])
    assert edge.balancer == ROUND_ROBIN, edge.balancer
    return RoundRobin(instances)


class Router:
    """Where the batches leaving one producer go: every exiting operator's outputs and edges.

    One per producer (a sub-query instance, or the engine for the sources).
    ``routes`` is :meth:`sparkcep.runtime.layout.Layout.routes` of the
    producer; ``channels`` maps each consumer endpoint to its producer end;
    ``tables``: this producer's copy of the bin table of every route-key
    operator (see :func:`bin_tables`). Each edge gets its own balancer here.
    """

    def __init__(self, routes: dict, channels: dict[tuple, Producer], tables: dict[str, BinTable]):
        self.tables = tables
        self.routes: dict[str, list] = {}
        for name, rs in routes.items():
            self.routes[name] = []
            for port, edge, ends in rs:
                balancer = None if edge is None else balancer_for(edge, len(ends), tables)
                targets = [channels[t] for t in ends]
                copy = [t.keeps_batches and not (balancer is not None and balancer.copies) for t in targets]
                self.routes[name].append((port, balancer, targets, copy))
        self.channels = list({id(c): c for c in channels.values()}.values())

    def send(self, name: str, batch: pa.RecordBatch, stamp: tuple[int, int, int]) -> None:
        """Route ``batch`` leaving operator ``name``; ``stamp``: (epoch, frontier, arrival ns).

        A part bound for a channel that keeps batches is copied unless its balancer made it afresh.
        """
        for port, balancer, targets, copy in self.routes.get(name, ()):
            if balancer is None:  # a query output: the engine's sink reads no event times
                parts = [(0, batch.drop_columns([c for c in (columns.TS, columns.WM) if c in batch.schema.names]))]
            else:
                parts = balancer.split(batch)
            for i, part in parts:
                if part.num_rows:
                    targets[i].send_data(port, stamp, columns.owned(part) if copy[i] else part)

    def progress(self, epoch: int, frontier: int, watermark: int, arrival: int) -> None:
        """Tell every consumer that ``epoch`` is complete."""
        for c in self.channels:
            c.send_progress(epoch, frontier, watermark, arrival)

    def hold_wakes(self) -> None:
        """Write without waking sleeping consumers until :meth:`release_wakes`, which wakes each once."""
        for c in self.channels:
            c.hold_wakes()

    def release_wakes(self) -> None:
        for c in self.channels:
            c.release_wakes()

    def abort(self, epoch: int) -> None:
        """Tell every consumer that ``epoch`` is void."""
        for c in self.channels:
            c.abort(epoch)

    def control(self, record: Control) -> None:
        """Apply a control record to this router (a Configure of one of its tables), then pass it on."""
        if isinstance(record, Configure) and record.operator in self.tables:
            self.tables[record.operator].assign(record.bins, record.owners)
        for c in self.channels:
            c.send_control(record)

    def flush(self) -> bool:
        done = True
        for c in self.channels:
            done = c.flush() and done
        return done

    @property
    def backlog_bytes(self) -> int:
        return sum(c.backlog_bytes for c in self.channels)


def bin_tables(layout, bins: int, owners: dict[str, list[int]] | None = None) -> dict[str, BinTable]:
    """A fresh copy of the bin table of every route-key operator of ``layout`` (``owners``: their current
    owners; default: contiguous ranges)."""
    out = {}
    for e in layout.edges:
        if e.balancer == ROUTE_KEY and e.dst.name not in out:
            n = layout.parallelism[layout.sq_of(e.dst).name]
            out[e.dst.name] = BinTable(e.dst.name, bins, n, (owners or {}).get(e.dst.name))
    return out
