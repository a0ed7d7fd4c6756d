"""The table of collectives is the one list: everything that names collectives agrees with it."""

from __future__ import annotations

import pytest

from aioccl import Communicator
from aioccl.algorithms import ALGORITHMS, COLLECTIVES, plan
from aioccl.algorithms.shm import SHM_ALGORITHMS, shm_plan
from aioccl.algorithms.table import BY_CODE, TABLE, name_of
from aioccl.engine.notices import ROOTED, describe_call
from aioccl.gpu import plans as gpu_plans
from aioccl.tools.sim import BLOCKWISE, SIM_COLLS


def test_codes_and_names_are_unique_and_stable():
    assert len({c.code for c in TABLE}) == len(TABLE) == len({c.name for c in TABLE})
    # on the wire: a peer of another version must read the same numbers
    assert [(c.name, c.code) for c in TABLE][:9] == [
        ("all_reduce", 1), ("broadcast", 2), ("reduce", 3), ("all_gather", 4), ("reduce_scatter", 5),
        ("gather", 6), ("scatter", 7), ("all_to_all", 8), ("barrier", 9)]
    assert name_of(99) == "op 99" and all(name_of(c.code) == c.name for c in TABLE)


def test_every_list_of_collectives_is_derived_from_the_table():
    assert tuple(c.name for c in TABLE) == COLLECTIVES
    assert {c.name: c.socket for c in TABLE} == ALGORITHMS and {c.name: c.shm for c in TABLE} == SHM_ALGORITHMS
    assert {c.code for c in TABLE if c.rooted} == ROOTED
    assert set(BLOCKWISE) == {c.name for c in TABLE if c.blockwise} and set(SIM_COLLS) <= set(COLLECTIVES)
    assert set(gpu_plans.BLOCKED) == {c.name for c in TABLE if c.input_blocks}
    for c in TABLE:
        assert callable(getattr(Communicator, c.name)), c.name
        assert describe_call((c.code, 0, 0, 4, 1)).startswith(c.name)


@pytest.mark.parametrize("coll", [c.name for c in TABLE])
def test_every_algorithm_the_table_names_has_a_schedule(coll):
    row = next(c for c in TABLE if c.name == coll)
    for algo in row.socket:
        assert any(plan(coll, 10, rank, 3, 1, 4, algo).steps for rank in range(3)), algo
    for algo in row.shm:
        for rank in range(3):
            assert shm_plan(coll, 10, rank, 3, 1, 4, algo).steps
    assert BY_CODE[row.code] is row
