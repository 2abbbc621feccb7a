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
