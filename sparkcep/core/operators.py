"""Physical operators: what runs inside a sub-query instance.

Stateless operators transform each batch as it comes. Stateful operators
buffer their input and, at each progress point, consume the rows up to the
progress frontier in (sequence number, output id) order and fire what the
watermark closed; so their results never depend on arrival order. Every
operator gives its rows output ids as :mod:`sparkcep.core.ids` says.
"""

from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Iterable

import numpy as np
import pyarrow as pa

from sparkcep.core import columns, ids
from sparkcep.core.aggregate import WindowAggregate
from sparkcep.core.binstate import BinState, Progress, checked_bins, later_step
from sparkcep.core.evaluate import evaluate, to_arrow
from sparkcep.core.hashing import derive_ids, key_bins, operator_salt
from sparkcep.core.join import WindowJoin
from sparkcep.core.partition import select
from sparkcep.core.running import RunningAggregate
from sparkcep.errors import QueryError
from sparkcep.query import operators as logical
from sparkcep.query.expressions import Col
from sparkcep.query.running import Running
from sparkcep.query.windows import TimeWindow
from sparkcep.schema import TYPES

log = logging.getLogger("sparkcep")
_late_logged: set[tuple[str, str]] = set()  # (query, operator) whose late tuples this process reported

WM_END = np.iinfo(np.int64).max  # the watermark of an ended input
# the watermark of an input that has sent nothing yet; far below any real event time but
# not int64's minimum, so `watermark - lateness - size` cannot wrap around
WM_NONE = -(2 ** 62)


class PhysicalOperator:
    def __init__(self, op: logical.Operator):
        self.op = op

    def process(self, port: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        raise NotImplementedError

    def advance(self, frontier: int, watermark: int) -> Iterable[pa.RecordBatch]:
        """Progress: every row with sequence number <= ``frontier`` has arrived."""
        return []

    def output_watermark(self, watermark: int) -> int:
        return watermark


class MapOp(PhysicalOperator):
    """Evaluates each output field; a field that only names an input column of its type keeps that
    column as it is (a timestamp passed through its numbers and back cost 3 ns a row)."""

    def __init__(self, op):
        super().__init__(op)
        self.fields = [(name, e, e.name if isinstance(e, Col) else None, TYPES[op.schema.fields[name]])
                       for name, e in op.fields.items()]
        self.names = op.schema.names + list(columns.HIDDEN)

    def process(self, port, batch):
        n, schema = batch.num_rows, self.op.inputs[0].schema
        cols = []
        for name, e, same, target in self.fields:
            if same is not None and (c := batch.column(same)).type == target:
                cols.append(c)
            else:
                cols.append(to_arrow(*evaluate(e, batch, schema), self.op.schema.fields[name], n))
        cols += [batch.column(h) for h in columns.HIDDEN]
        return [pa.RecordBatch.from_arrays(cols, names=self.names)]


class FilterOp(PhysicalOperator):
    def process(self, port, batch):
        value, valid = evaluate(self.op.condition, batch, self.op.schema)
        keep = value & valid
        if keep.all():
            return [batch]
        return [select(batch, keep)] if keep.any() else []


class UnionOp(PhysicalOperator):
    """Passes every input on; ids are refolded with the input port, so the two copies of a tuple
    that reached it through two demux branches differ."""

    def __init__(self, op):
        super().__init__(op)
        self.salts = [operator_salt(op.name, port) for port in range(len(op.inputs))]

    def process(self, port, batch):
        i = batch.schema.get_field_index(columns.ID)
        return [batch.set_column(i, columns.ID, pa.array(derive_ids(self.salts[port], batch.column(i).to_numpy())))]


class ApplyOp(PhysicalOperator):
    """Runs a user's ``fn(batch) -> batch``; the batch carries the engine's hidden columns, which
    its rows keep. A row emitted more than once is told apart by occurrence (:func:`ids.apply_ids`)."""

    def __init__(self, op):
        super().__init__(op)
        self.salt = operator_salt(op.name)

    def process(self, port, batch):
        out = _returned(self.op.fn(batch), f"apply({self.op.name})", self.op.schema, hidden=True,
                        others=None if self.op.declared else "declare what it returns: apply(fn, schema=...)")
        if out is None:
            return []
        i = out.schema.get_field_index(columns.ID)
        renumbered = ids.apply_ids(self.salt, out.column(columns.SEQ).to_numpy(), out.column(i).to_numpy())
        return [out if renumbered is None else out.set_column(i, columns.ID, pa.array(renumbered))]


class StatefulOp(PhysicalOperator, ABC):
    """Buffers input per port; at progress consumes it in (sequence number, id) order, then fires
    (with :attr:`any_order`, batch by batch: first those a firing window reads, the rest once the
    results are out).

    Tuples that come after their window fired are *late*: never merged,
    counted, reported in the log the first time, and, for an aggregate with
    ``late=``, put in ``late_batches`` for its :class:`~sparkcep.query.operators.LateRows`.

    ``step`` names the advance under way, the same in every instance and
    replica: (its frontier, how many advances before it had that frontier —
    an end of input repeats the last one). Rows that are one update of a
    running state derive their ids from it.
    """

    def __init__(self, op, bins: int):
        super().__init__(op)
        self.bins = bins
        self.pending: list[list[pa.RecordBatch]] = [[] for _ in op.inputs]
        self.late_batches: list[pa.RecordBatch] = []
        self.step: tuple[int | None, int] = (None, 0)
        self.any_order = False  # consume() gives the same results in any row order: no sort, batch by batch
        # late tuples per input port and bin: they move with their bins, so no count is lost when an
        # instance hands all of its bins on and leaves (a rescale down)
        self.late_bins = np.zeros((len(op.inputs), bins), np.int64)

    def count_late(self, port: int, bins: np.ndarray) -> None:
        """Count late tuples of input ``port``, one per entry of ``bins`` (the bin of each)."""
        if len(bins):
            np.add.at(self.late_bins[port], bins, 1)
            self.note_late(len(bins))

    def note_late(self, n: int) -> None:
        """``n`` tuples were late: say so in the log, once per operator and process."""
        if (self.op.query.name, self.op.name) not in _late_logged:
            _late_logged.add((self.op.query.name, self.op.name))
            kept = self.op.late_output.stream if getattr(self.op, "late_output", None) else None
            log.warning("query %s: operator %r dropped %d late tuple(s) (their window had fired); "
                        "late tuples are counted in metrics()['late']%s", self.op.query.name, self.op.name, n,
                        f" and kept in output {kept!r}" if kept else "; aggregate(..., late='name') keeps them")

    def process(self, port, batch):
        if batch.num_rows:
            self.pending[port].append(batch)
        return []

    def advance(self, frontier, watermark):
        """Yields what consuming the input up to ``frontier`` and firing at ``watermark`` emits.

        In any order, the rows no window firing now reads stay pending: :meth:`settle` consumes them once
        the results are out, or the next advance does.
        """
        self.step = (frontier, self.step[1] + 1 if frontier == self.step[0] else 0)
        watermark = None if watermark >= WM_END else watermark
        for port, batches in enumerate(self.pending):
            if batches and self.any_order:
                ready, self.pending[port] = _split_ready(batches, frontier)
                for batch in ready:
                    now, later = self.split_open(batch, watermark)
                    if later is not None:
                        self.pending[port].append(later)
                    if now is not None:
                        yield from self.consume(port, now)
            elif batches:
                ready, self.pending[port] = _take_ready(batches, frontier)
                if ready is not None:
                    yield from self.consume(port, ready)
        yield from self.fire(watermark)

    def settle(self) -> None:
        """Consume the rows up to the last frontier that :meth:`advance` left pending. They only open
        windows, so consuming them emits nothing; until then migration and replication move them as
        pending rows."""
        frontier = self.step[0]
        if not self.any_order or frontier is None:
            return
        for port, batches in enumerate(self.pending):
            if batches:
                ready, self.pending[port] = _split_ready(batches, frontier)
                for batch in ready:
                    self.consume(port, batch)

    def split_open(self, batch: pa.RecordBatch, watermark: int | None):
        """(the rows of ``batch`` a window firing at ``watermark`` (None: the end) may read, the rows
        no such window reads); each None when it has no row."""
        return batch, None

    @abstractmethod
    def consume(self, port: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """What consuming ``batch`` (rows in (sequence number, id) order) emits."""

    def fire(self, watermark: int | None) -> list[pa.RecordBatch]:
        return []

    @abstractmethod
    def extract(self, bins: np.ndarray | None, keep: bool):
        """The operator state of ``bins`` (None: all), removed unless ``keep``."""

    @abstractmethod
    def install(self, state, progress: Progress) -> None:
        """Take over the state of bins extracted from another instance whose progress was ``progress``,
        merging its fields with this instance's."""

    def progress(self) -> Progress:
        """This instance's scalar progress (see :class:`~sparkcep.core.binstate.Progress`)."""
        return Progress(step=self.step)

    def take_bins(self, bins: np.ndarray | None = None) -> BinState:
        """Remove and return the state of ``bins`` (None: every bin held here) and their tuples not
        consumed yet.

        What migration and State Transfer move (DESIGN §5); :meth:`put_bins`
        installs it in another instance of the same operator. Costs what
        the bins hold (and a pass over the pending tuples), not what stays.
        """
        return self._bins_out(bins, keep=False)

    def copy_bins(self, bins: np.ndarray | None = None) -> BinState:
        """What :meth:`take_bins` returns, leaving this instance unchanged: replica catch-up copies
        a survivor's state."""
        return self._bins_out(bins, keep=True)

    def put_bins(self, moved: BinState) -> None:
        """Install bins taken or copied from another instance of the same operator; none of them is
        held here (this instance may hold other bins, or none: a new instance)."""
        self.step = later_step(self.step, moved.progress.step)
        self.install(moved.state, moved.progress)
        if moved.late is not None:
            self.late_bins[:, slice(None) if moved.bins is None else moved.bins] += moved.late
        for port, batch in enumerate(moved.pending):
            if batch is not None and batch.num_rows:
                self.pending[port].append(batch)

    def _bins_out(self, bins, keep: bool) -> BinState:
        """The state and pending tuples of ``bins``, removed unless ``keep``."""
        bins = checked_bins(bins, self.bins)
        pending = []
        for port, batches in enumerate(self.pending):
            batch = _concat(batches)
            if batch is not None and bins is not None:
                mine = np.isin(self._bins(port, batch), bins)
                if not keep:
                    self.pending[port] = [batch.filter(pa.array(~mine))] if not mine.all() else []
                batch = batch.filter(pa.array(mine)) if mine.any() else None
            elif not keep:
                self.pending[port] = []
            pending.append(batch)
        chosen = slice(None) if bins is None else bins
        late = self.late_bins[:, chosen].copy()
        if not keep:
            self.late_bins[:, chosen] = 0
        return BinState(bins, self.extract(bins, keep), pending, self.progress(), late)

    def _bins(self, port: int, batch: pa.RecordBatch) -> np.ndarray:
        """The bin of each row of ``batch`` arriving on ``port`` (by the keys this operator routes on)."""
        op = self.op
        keys = [pair[port] for pair in op.on] if isinstance(op, logical.Join) else list(op.by)
        if not keys:
            return np.zeros(batch.num_rows, np.int64)
        return key_bins(*columns.encode_keys(batch, keys), self.bins)


class AggregateOp(StatefulOp):
    def __init__(self, op: logical.Aggregate, bins: int):
        super().__init__(op, bins)
        self.running = isinstance(op.window, Running)
        kind = RunningAggregate if self.running else WindowAggregate
        self.agg = kind(op.window, op.by, op.funcs, op.inputs[0].schema, op.schema, bins, op.name)
        # concatenating an epoch's batches, sorting and taking them again: a tenth of a HiBench fixwindow instance
        self.any_order = not self.running and self.agg.order_free and op.late_output is None

    def consume(self, port, batch):
        out = self.agg.add(batch, self.step) if self.running else self.agg.add(batch)
        late = getattr(self.agg, "late_rows", None)
        if late is not None and late.size:
            rows = columns.take(batch, late)
            self.count_late(port, self._bins(port, rows))
            if self.op.late_output is not None:
                self.late_batches.append(rows)
        return out

    def fire(self, watermark):
        return self.agg.fire(watermark)

    def split_open(self, batch, watermark):
        if self.running or watermark is None:
            return batch, None
        opens = self.agg.open_after_fire(batch.column(columns.TS).to_numpy(), watermark)
        return _split_rows(batch, ~opens)

    def output_watermark(self, watermark):
        w = self.op.window
        return watermark - w.lateness_us if isinstance(w, TimeWindow) and WM_NONE < watermark < WM_END else watermark

    @property
    def late(self) -> int:
        return int(self.late_bins.sum())

    @property
    def late_by_port(self) -> list[int]:
        return [self.late]

    def extract(self, bins, keep):
        return self.agg.copy_bins(bins) if keep else self.agg.take_bins(bins)

    def install(self, state, progress):
        if self.running:
            self.agg.put_bins(state)
        else:
            self.agg.put_bins(state, progress.lowest_start)

    def progress(self):
        return replace(super().progress(), lowest_start=getattr(self.agg, "lowest_start", None))


class JoinOp(StatefulOp):
    def __init__(self, op: logical.Join, bins: int):
        super().__init__(op, bins)
        self.join = WindowJoin(op, bins)

    def consume(self, port, batch):
        self.count_late(port, self.join.add(port, batch))
        return []

    def fire(self, watermark):
        return self.join.fire(watermark)

    def output_watermark(self, watermark):
        return watermark - self.op.window.lateness_us if WM_NONE < watermark < WM_END else watermark

    @property
    def late(self) -> int:
        return int(self.late_bins.sum())

    @property
    def late_by_port(self) -> list[int]:
        return [int(n) for n in self.late_bins.sum(axis=1)]

    def extract(self, bins, keep):
        return self.join.take_bins(bins, keep)

    def install(self, state, progress):
        self.join.put_bins(state, progress.fired, progress.next_start)

    def progress(self):
        return replace(super().progress(), fired=self.join.fired, next_start=self.join.next_start)


class CustomOp(StatefulOp):
    """A user's :class:`~sparkcep.query.operators.StatefulOperator` and its state (by default a dict
    bin -> value).

    Its rows get ``__seq`` = the frontier of the advance that emitted them and
    ids from the step and their content (:func:`ids.content_ids`), the same
    wherever its bins run.
    """

    def __init__(self, op: logical.Custom, bins: int):
        super().__init__(op, bins)
        self.user = op.op
        self.state = self.user.new_state(bins)
        self.salt = operator_salt(op.name)
        self._ts = 0

    def consume(self, port, batch):
        if self.op.by:
            b = key_bins(*columns.encode_keys(batch, self.op.by), self.bins)
        else:
            b = np.zeros(batch.num_rows, np.int64)
        self._ts = max(self._ts, int(batch.column(columns.TS).to_numpy().max()))
        visible = batch.select(self.op.inputs[0].schema.names)
        return self._stamp(self.user.process(visible, b, self.state), 0)

    def fire(self, watermark):
        if watermark is None:
            return self._stamp(self.user.on_end(self.state), 2)
        return self._stamp(self.user.on_watermark(watermark, self.state), 1)

    def _stamp(self, out, call: int) -> list[pa.RecordBatch]:
        out = _returned(out, f"stateful({type(self.user).__name__})", self.op.schema, hidden=False)
        if out is None:
            return []
        n, names = out.num_rows, self.op.schema.names
        out = out.append_column(columns.SEQ, pa.array(np.full(n, self.step[0], np.int64)))
        out = out.append_column(columns.ID, pa.array(ids.content_ids(self.salt, self.step, call, out, names)))
        for name in (columns.TS, columns.WM):
            out = out.append_column(name, pa.array(np.full(n, self._ts, np.int64)))
        return [out]

    def extract(self, bins, keep):
        """{bin: the user's value} of ``bins`` (None: all), by the user's ``extract`` per bin; a copy
        installs each value back and deep-copies it."""
        values = {}
        for b in range(self.bins) if bins is None else bins.tolist():
            value = self.user.extract(self.state, b)
            if value is None:
                continue
            if keep:
                self.user.install(self.state, b, value)
                value = copy.deepcopy(value)
            values[b] = value
        return values

    def install(self, state, progress):
        for b, value in state.items():
            self.user.install(self.state, b, value)
        self._ts = max(self._ts, progress.ts)

    def progress(self):
        return replace(super().progress(), ts=self._ts)


def _returned(out, who: str, schema, hidden: bool, others: str | None = None) -> pa.RecordBatch | None:
    """What a user's code returned as a batch of ``schema``'s fields (and, ``hidden``, the hidden
    columns) in their order and types; None when it returned no row. Other fields are dropped, or
    refused with the advice ``others``."""
    if isinstance(out, pa.Table):
        out = out.combine_chunks().to_batches()[0] if out.num_rows else None
    if out is None or (isinstance(out, pa.RecordBatch) and out.num_rows == 0):
        return None
    if not isinstance(out, pa.RecordBatch):
        raise QueryError(f"{who}: the function returned {type(out).__name__}, expected a pyarrow.RecordBatch "
                         "(or Table, or None); from pandas: pa.RecordBatch.from_pandas(df, preserve_index=False)")
    hidden_names = list(columns.HIDDEN) if hidden else []
    missing = [n for n in schema.names if n not in out.schema.names]
    if missing:
        raise QueryError(f"{who}: the returned batch lacks {missing} of its schema {schema.names}")
    lost = [n for n in hidden_names if n not in out.schema.names]
    if lost:
        raise QueryError(f"{who}: the returned batch lacks the input's hidden columns {lost}; keep them "
                         "(filter/take/append_column do)")
    extra = [n for n in out.schema.names if n not in schema.fields and n not in columns.HIDDEN]
    if extra and others:
        raise QueryError(f"{who}: the function returned fields {extra} beyond its schema {schema.names}; {others}")
    want = schema.to_arrow()
    types = list(want.types) + [pa.int64()] * len(hidden_names)
    out = out.select(schema.names + hidden_names)
    for name, got, typ in zip(out.schema.names, out.schema.types, types):
        if got != typ:
            try:
                out = out.set_column(out.schema.get_field_index(name), name, out.column(name).cast(typ))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise QueryError(f"{who}: the returned field {name!r} is {got}, not the {typ} its schema "
                                 f"declares, and does not convert: {e}") from None
    return out


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch | None:
    """The rows of ``batches`` as one batch (None: no batch)."""
    return None if not batches else batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _split_rows(batch: pa.RecordBatch, mask: np.ndarray):
    """(the rows of ``batch`` where ``mask`` holds, the others), each None when empty; slices when the
    rows where it holds come first (a batch in event-time order, split by a time)."""
    k = int(np.count_nonzero(mask))
    if k == 0 or k == len(mask):
        return (batch, None) if k else (None, batch)
    if mask[:k].all():
        return batch.slice(0, k), batch.slice(k)
    return batch.filter(pa.array(mask)), batch.filter(pa.array(~mask))


def _split_ready(batches: list[pa.RecordBatch], frontier: int):
    """(the rows with seq <= frontier, as batches; the remaining batches), in no particular order."""
    ready: list[pa.RecordBatch] = []
    rest: list[pa.RecordBatch] = []
    for batch in batches:
        seq = batch.column(columns.SEQ).to_numpy()
        if seq.max() <= frontier:
            ready.append(batch)
            continue
        keep = seq <= frontier
        if keep.any():
            ready.append(batch.filter(pa.array(keep)))
        rest.append(batch.filter(pa.array(~keep)))
    return ready, rest


def _take_ready(batches: list[pa.RecordBatch], frontier: int):
    """(rows with seq <= frontier sorted by (seq, id), the remaining batches)."""
    batch = _concat(batches)
    seq = batch.column(columns.SEQ).to_numpy()
    rest: list[pa.RecordBatch] = []
    if seq.size and seq.max() > frontier:
        keep = seq <= frontier
        rest = [batch.filter(pa.array(~keep))]
        batch = batch.filter(pa.array(keep))
        seq = batch.column(columns.SEQ).to_numpy()
    if batch.num_rows == 0:
        return None, rest
    perm = ids.consume_order(seq, batch.column(columns.ID).to_numpy())
    if perm is not None:
        batch = columns.take(batch, perm)
    return batch, rest


PHYSICAL = {logical.Map: MapOp, logical.Filter: FilterOp, logical.Union: UnionOp, logical.Apply: ApplyOp,
            logical.LateRows: PhysicalOperator}  # fed by its aggregate, never through process()
STATEFUL = {logical.Aggregate: AggregateOp, logical.Join: JoinOp, logical.Custom: CustomOp}


def physical(op: logical.Operator, bins: int) -> PhysicalOperator:
    if type(op) in STATEFUL:
        return STATEFUL[type(op)](op, bins)
    return PHYSICAL[type(op)](op)
