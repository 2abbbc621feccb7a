"""Property: on 2 to 4 instance managers, 1 to 4 instances per sub-query give every output the rows
and output ids (``__seq``, ``__id``) of parallelism 1 in one process, ids unique within an output."""

from hypothesis import given, settings
from hypothesis import strategies as st

import sparkcep as cep
from core.id_queries import assert_same_ids, build, id_rows, parallelism, params, sends, start_at


@settings(deadline=None, max_examples=max(1, settings().max_examples // 2))  # each example deploys on IMs
@given(p=params(), data=st.data(), workers=st.sampled_from([2, 3, 4]))
def test_output_ids_on_instance_managers_equal_parallelism_one(p, data, worker_engines, workers):
    p["name"] = "ids_im"
    q = build(p)
    sent = data.draw(sends(list(q.sources)))
    par = parallelism(q, data.draw)
    engine = worker_engines(workers)
    start = engine.metrics()["sequence"]  # the session's engines number on: number the reference alike
    got = id_rows(engine, q, sent, parallelism=par)
    with cep.Engine.local() as e:
        start_at(e, start)
        want = id_rows(e, build(p), sent)
    assert_same_ids(got, want, f"{p['front']} -> {p['back']} at parallelism {par} on {workers} IMs")
