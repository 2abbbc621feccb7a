"""``map()`` fields given as a dict: output names a keyword cannot be, such as ``name``."""

import pytest

import sparkcep as cep
from harness import run


def test_a_field_called_name_and_the_operator_name():
    q = cep.Query("m")
    s = q.stream("ev", "id int64, name string")
    people = s.map({"name": "name", "first letter": cep.col("name").split_part(" ", 1)}, id="id", name="people")
    q.output("out", people)
    assert people.name == "people" and people.schema.names == ["name", "first letter", "id"]
    got = run(q, [("ev", [{"id": 1, "name": "Ann Lee"}, {"id": 2, "name": None}])]).outputs["out"]
    assert got.values.tolist() == [["Ann Lee", "Ann", 1], [None, None, 2]]


def test_a_field_given_twice_is_an_error():
    s = cep.Query("m").stream("ev", "id int64")
    with pytest.raises(cep.QueryError, match="'id' is given twice"):
        s.map({"id": "id"}, id="id")
    with pytest.raises(cep.QueryError, match="at least one output field"):
        s.map({})


def test_a_constant_field_is_refused_naming_lit():
    s = cep.Query("m").stream("ev", "id int64")
    with pytest.raises(cep.QueryError, match=r"field 'c': expected a field name or expression, got 3 \(a constant: "
                                             r"cep\.lit\(3\)\)$"):
        s.map(c=3)
    with pytest.raises(cep.QueryError, match=r"got \[1\]$"):
        s.map(c=[1])
    assert s.map(c=cep.lit(3)).schema.names == ["c"]


def test_the_package_lists_each_public_name_once():
    names = dir(cep)
    assert len(names) == len(set(names)) and {"Query", "lit", "Engine"} <= set(names)
