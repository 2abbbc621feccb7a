"""``Running``: the window kind of a running aggregate — no window, updates as the input comes.

``stream.aggregate(cep.Running(), by="word", n=cep.count())`` keeps one
entry per group from the start of the stream, never closes it, and after
each batch the engine ingests (one ``Engine.send``, or what the Spark sink
hands over at once) emits one row per group that batch held, with the
functions over every tuple of the group so far: Spark's
``groupBy(...).agg(...)`` in ``update`` output mode, with the engine's batch
in place of Spark's micro-batch.
"""

from __future__ import annotations


class Running:
    """No window: the aggregate of each group so far, updated after every input batch.

    Output rows: the ``by`` fields, then each function; in an update, rows
    follow the order of their group's last tuple in the batch. Nothing is
    late and nothing fires at the watermark or at end of input: every row
    leaves with the batch that updated it.

    >>> Running()
    Running()
    """

    def __repr__(self) -> str:
        return "Running()"
