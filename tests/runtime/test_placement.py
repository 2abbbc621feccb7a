"""NUMA topology and placement, on the Bullion S16 of the UPM-CEP paper (16 nodes x 18 cores)."""

import os
import re
from pathlib import Path

import pytest

import sparkcep as cep
from sparkcep.query.planner import plan
from sparkcep.runtime.layout import Layout
from sparkcep.runtime.placement import Slot, im_slots, place
from sparkcep.runtime.topology import Topology, parse_cpulist

BULLION = Path(__file__).parent / "data" / "bullion_s16.json"


@pytest.fixture
def bullion():
    return Topology.from_file(BULLION)


def test_bullion_distance_table_is_the_papers_figure_2(bullion):
    assert sorted(bullion.nodes) == list(range(16))
    assert all(len(cpus) == 18 for cpus in bullion.nodes.values())
    for i in range(16):
        for j in range(16):
            want = 10 if i == j else 15 if {i, j} == {i - i % 2, i - i % 2 + 1} else 40
            assert bullion.distance(i, j) == want, (i, j)
    assert bullion.by_distance(5)[:2] == [5, 4]


def test_a_fake_sysfs_tree_reads_like_the_file(bullion, tmp_path):
    for n, cpus in bullion.nodes.items():
        d = tmp_path / f"node{n}"
        d.mkdir()
        (d / "cpulist").write_text(f"{cpus[0]}-{cpus[-1]}\n")
        (d / "distance").write_text(" ".join(map(str, bullion.distances[n])) + "\n")
    (tmp_path / "possible").write_text("0-15\n")  # other sysfs entries are ignored
    fake = Topology.from_file(tmp_path)
    assert fake.nodes == bullion.nodes and fake.distances == bullion.distances


def test_this_machine_topology_has_the_cpus_we_may_use():
    t = Topology.load()
    assert sorted(t.cpus) == sorted(os.sched_getaffinity(0))
    assert all(t.distance(n, n) == 10 for n in t.nodes)
    assert parse_cpulist("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]


def test_instance_managers_fill_a_node_then_its_pair(bullion):
    slots = im_slots(bullion, 40)
    assert [s.node for s in slots[:18]] == [0] * 18
    assert [s.node for s in slots[18:36]] == [1] * 18  # the paired node (distance 15) before the others
    assert len({s.cpu for s in slots}) == 40


def pipeline(n_sq: int, instances: int):
    """A chain of ``n_sq`` sub-queries (aggregates), each with ``instances`` instances."""
    q = cep.Query("chain")
    s = q.stream("src", "k string, ts timestamp, v int64")
    for i in range(n_sq):
        s = s.aggregate(cep.TupleWindow(2), by="k", name=f"a{i}", v=cep.count())
    q.output("out", s)
    p = plan(q)
    return Layout(p, {sq.name: instances for sq in p.subqueries})


def nodes_of(assign, slots, sq):
    return {slots[im].node for (name, _), im in assign.items() if name == sq}


def test_communicating_subqueries_land_on_one_node_and_instances_spread_over_cores(bullion):
    layout = pipeline(3, 4)
    slots = [Slot(i, cpu, bullion.node_of(cpu)) for i, cpu in enumerate(bullion.cpus)]  # one IM per core
    assign = place(layout, slots, bullion)
    nodes = {slots[im].node for im in assign.values()}
    assert len(nodes) == 1  # 12 instances exchanging data: one node
    for sq in ("SQ1", "SQ2", "SQ3"):
        ims = [im for (name, _), im in assign.items() if name == sq]
        assert len(set(ims)) == 4  # the instances of one sub-query on four different cores
    assert len(set(assign.values())) == 12  # and nobody doubles up while cores are free


def test_heavy_pairs_share_a_node_and_the_rest_goes_to_the_paired_node(bullion):
    """Eight instance managers per node: SQ1+SQ2 (heavy traffic) fill one node, SQ3+SQ4 another —
    the paired node at distance 15, since SQ2 -> SQ3 still talks, not a node at distance 40."""
    layout = pipeline(4, 4)
    slots = [Slot(i, cpu, bullion.node_of(cpu)) for i, cpu in
             enumerate(c for n in range(16) for c in bullion.nodes[n][:8])]
    traffic = {("SQ1", "SQ2"): 100.0, ("SQ2", "SQ3"): 1.0, ("SQ3", "SQ4"): 100.0}
    assign = place(layout, slots, bullion, traffic)
    n1, n2 = nodes_of(assign, slots, "SQ1"), nodes_of(assign, slots, "SQ2")
    n3, n4 = nodes_of(assign, slots, "SQ3"), nodes_of(assign, slots, "SQ4")
    assert n1 == n2 and len(n1) == 1 and n3 == n4 and len(n3) == 1
    (a,), (b,) = n1, n3
    assert a != b and bullion.distance(a, b) == 15
    for sq in ("SQ1", "SQ2", "SQ3", "SQ4"):
        assert len({assign[(sq, i)] for i in range(4)}) == 4


def test_placement_follows_traffic_not_declaration_order(bullion):
    """SQ1 talks little to SQ2 but a lot to SQ3 (a join's second input): SQ1 and SQ3 share a node."""
    q = cep.Query("join")
    a = q.stream("a", "k string, ts timestamp, v int64")
    b = q.stream("b", "k string, ts timestamp, v int64")
    left = a.aggregate(cep.TimeWindow("1s"), by="k", name="la", v=cep.count())
    right = b.aggregate(cep.TimeWindow("1s"), by="k", name="ra", v=cep.count())
    q.output("o", left.join(right, cep.TimeWindow("10s"), on="k", name="j"))
    p = plan(q)
    layout = Layout(p, {sq.name: 6 for sq in p.subqueries})
    slots = [Slot(i, cpu, bullion.node_of(cpu)) for i, cpu in
             enumerate(c for n in range(16) for c in bullion.nodes[n][:12])]
    traffic = {("SQ1", "SQ3"): 1.0, ("SQ2", "SQ3"): 50.0}
    assign = place(layout, slots, bullion, traffic)
    assert nodes_of(assign, slots, "SQ2") == nodes_of(assign, slots, "SQ3")
    (n1,), (n3,) = nodes_of(assign, slots, "SQ1"), nodes_of(assign, slots, "SQ3")
    assert bullion.distance(n1, n3) == 15  # the light partner next door


def test_more_instances_than_cores_share_evenly(bullion):
    layout = pipeline(2, 5)
    slots = [Slot(i, i, 0) for i in range(4)]
    assign = place(layout, slots, Topology({0: [0, 1, 2, 3]}, [[10]]))
    load = [list(assign.values()).count(i) for i in range(4)]
    assert sorted(load) == [2, 2, 3, 3]
    for sq in ("SQ1", "SQ2"):
        ims = [assign[(sq, i)] for i in range(5)]
        assert len(set(ims)) == 4  # five instances over all four cores


def test_a_local_engine_pins_its_instance_managers_and_explains_placement():
    with cep.Engine.local(workers=2) as engine:
        q = cep.Query("pinned")
        s = q.stream("p_in", "k string, ts timestamp, v int64")
        q.output("p_out", s.aggregate(cep.TimeWindow("1s"), by="k", name="agg", n=cep.count()))
        dep = engine.deploy(q, parallelism=2)
        text = dep.explain()
        ims = engine.metrics()["instance_managers"]
    cpus = sorted(os.sched_getaffinity(0))
    for i, m in ims.items():
        assert m["cpu"] == cpus[i % len(cpus)]
        assert m["cpu_num"] == m["cpu"]  # psutil sees it running where it was pinned
        assert f"instance manager im-{i} ({m['address']}, pid {m['pid']}, cpu {m['cpu']}, node {m['node']})" in text
    assert "SQ1 x2" in text


def test_a_topology_naming_cpus_this_machine_lacks_fails_clearly():
    allowed = os.sched_getaffinity(0)
    missing = [c for c in range(18) if c not in allowed]
    if not missing:
        pytest.skip("this machine has all of the Bullion's node-0 cpus")
    with pytest.raises(cep.EngineError) as e:
        cep.Engine.local(workers=18, topology=BULLION)
    assert e.value.code == "WORKER_START"
    pinned = re.search(r"cannot pin to cpu (\d+)", str(e.value))  # the first of the workers to fail
    assert pinned and int(pinned.group(1)) in missing, str(e.value)
