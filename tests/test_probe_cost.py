"""Paper 002's probe-cost model (CLASH, Eq. 1) and the search for each input's partitioning class and
each stream's route: the paper's worked example (section V), and random join graphs against a brute
force over every partitioning and every route written here from the equation."""

from __future__ import annotations

import itertools
import json
import math
import random
from typing import Any

import pytest
from pyspark.sql import SparkSession


def probe_cost(spark: SparkSession, groups: list[dict[str, Any]], partitions: int, jointly: bool = False) -> dict[str, Any]:
    request = {"groups": groups, "partitions": partitions, "jointly": jointly}
    return json.loads(spark._jvm.umjoin.spark.testkit.CostModels.probeCost(json.dumps(request)))


def paper_example() -> list[dict[str, Any]]:
    """q1 = R(a), S(a, b), T(b) and q2 = S(b), T(b, c), U(c); every relation streams 100 tuples, S and T
    join to 150, the other joins to 100 (distinct values 100 * 100 / size)."""
    b = 100 * 100 / 150
    q1 = {"names": ["R", "S", "T"], "classes": [[0, 1], [1, 2]], "candidates": [[0], [0, 1], [1]],
          "starts": [0, 1, 2], "rates": [100, 100, 100], "distinct": [100, b]}
    q2 = {"names": ["S", "T", "U"], "classes": [[0, 1], [1, 2]], "candidates": [[0], [0, 1], [1]],
          "starts": [0, 1, 2], "rates": [100, 100, 100], "distinct": [b, 100]}
    return [q1, q2]


def test_the_papers_example_costs_475_per_query_alone_and_800_jointly(spark: SparkSession) -> None:
    answer = probe_cost(spark, paper_example(), partitions=1, jointly=True)
    alone = [g["cost"] for g in answer["groups"]]
    assert alone == pytest.approx([475, 475])
    assert answer["jointly"]["cost"] == pytest.approx(800)
    # Alone, q1's S avoids the larger S-T join first; together, S and T route through each other,
    # sharing their first steps with the other query.
    assert answer["groups"][0]["routes"]["1"] == [1, 0, 2]
    assert answer["jointly"]["routes"][0]["1"] == [1, 2, 0] and answer["jointly"]["routes"][1]["1"] == [1, 0, 2]


def size(inputs: tuple[int, ...], group: dict[str, Any]) -> float:
    """The join size of a set of inputs: the rates' product over the distinct values of the classes that
    connect the set, most distinct first, each class counted once per pair of components it merges."""
    value = math.prod(group["rates"][i] for i in inputs)
    component = {i: i for i in inputs}

    def root(i: int) -> int:
        return i if component[i] == i else root(component[i])

    for c in sorted(range(len(group["classes"])), key=lambda c: (-group["distinct"][c], c)):
        members = sorted(i for i in inputs if i in group["classes"][c])
        for a, b in zip(members, members[1:]):
            if root(a) != root(b):
                component[root(b)] = root(a)
                value /= group["distinct"][c]
    return value


def test_a_join_on_two_classes_counts_its_most_selective_one() -> None:
    """lineitem (0) and partsupp (1) on part key (class 0, 200 values) and supplier key (class 1, 10 values):
    the pair divides by 200 only; with a third input on class 1 the supplier key divides once more."""
    group = {"classes": [[0, 1], [0, 1, 2]], "rates": [6000, 800, 10], "distinct": [200, 10]}
    assert size((0, 1), group) == pytest.approx(6000 * 800 / 200)
    assert size((0, 1, 2), group) == pytest.approx(6000 * 800 * 10 / 200 / 10)
    assert size((1, 2), group) == pytest.approx(800 * 10 / 10)


def route_cost(order: tuple[int, ...], partitioning: tuple[int | None, ...], group: dict[str, Any], partitions: int) -> float:
    """Eq. 1 for one route: step j sends the join of the first j inputs, 1/j of it, to the next store,
    once or to each of its partitions when its partitioning class is not bound yet."""
    total = 0.0
    for j in range(1, len(order)):
        prefix, nxt = order[:j], order[j]
        p = partitioning[nxt]
        chi = 1 if p is None or any(i in group["classes"][p] for i in prefix) else partitions
        total += size(prefix, group) / j * chi
    return total


def brute_force(group: dict[str, Any], partitions: int) -> float:
    n = len(group["names"])
    neighbours = {i: {j for c in group["classes"] if i in c for j in c if j != i} for i in range(n)}
    orders = {s: [o for o in itertools.permutations(range(n)) if o[0] == s and all(neighbours[o[k]] & set(o[:k]) for k in range(1, n))]
              for s in group["starts"]}
    options = [[None] if not cands else cands for cands in group["candidates"]]
    best = math.inf
    for partitioning in itertools.product(*options):
        cost = sum(min(route_cost(o, partitioning, group, partitions) for o in orders[s]) for s in group["starts"])
        best = min(best, cost)
    return best


def random_group(rng: random.Random) -> dict[str, Any]:
    while True:
        n = rng.randint(3, 6)
        k = rng.randint(2, 4)
        edges = [(rng.randrange(i), i, rng.randrange(k)) for i in range(1, n)]  # a tree ...
        edges += [tuple(sorted(rng.sample(range(n), 2))) + (rng.randrange(k),) for _ in range(rng.randint(0, 2))]  # ... and cycles
        classes = [sorted({x for a, b, c in edges if c == cls for x in (a, b)}) for cls in range(k)]
        classes = [c for c in classes if len(c) > 1]
        broadcast = {i for i in range(1, n) if rng.random() < 0.15}
        candidates = [[] if i in broadcast else [c for c, members in enumerate(classes) if i in members] for i in range(n)]
        starts = [i for i in range(n) if i not in broadcast and (i == 0 or rng.random() < 0.85)]
        if math.prod(max(1, len(c)) for c in candidates) <= 64:
            return {"names": [f"t{i}" for i in range(n)], "classes": classes, "candidates": candidates, "starts": starts,
                    "rates": [rng.choice([1, 10, 100, 1000, 10000]) * rng.uniform(0.5, 2) for _ in range(n)],
                    "distinct": [rng.choice([2, 10, 100, 1000]) * rng.uniform(0.5, 2) for _ in classes]}


@pytest.mark.parametrize("seed", range(4))
def test_the_search_finds_the_least_cost_of_every_partitioning_and_route(spark: SparkSession, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(10):
        group = random_group(rng)
        partitions = rng.choice([1, 2, 4, 16])
        (answer,) = probe_cost(spark, [group], partitions)["groups"]
        expected = brute_force(group, partitions)
        assert answer["cost"] == pytest.approx(expected, rel=1e-9), group
        # The choice it reports costs what it says, by the equation written here.
        partitioning = tuple(answer["partitioning"])
        recomputed = sum(route_cost(tuple(answer["routes"][str(s)]), partitioning, group, partitions) for s in group["starts"])
        assert recomputed == pytest.approx(expected, rel=1e-9)
        assert all(p is None if not c else p in c for p, c in zip(partitioning, group["candidates"]))


def test_without_statistics_a_star_on_one_key_is_partitioned_on_it(spark: SparkSession) -> None:
    """Four inputs on class 0; input 1 also joins a fifth on class 1. Only the fifth's rows, which do
    not carry class 0, go to every partition of input 1 (chi = 8)."""
    group = {"names": list("abcde"), "classes": [[0, 1, 2, 3], [1, 4]], "candidates": [[0], [0, 1], [0], [0], [1]],
             "starts": [0, 1, 2, 3, 4], "rates": [1] * 5, "distinct": [1, 1]}
    (answer,) = probe_cost(spark, [group], partitions=8)["groups"]
    assert answer["partitioning"] == [0, 0, 0, 0, 1]
    assert answer["cost"] == pytest.approx(brute_force(group, 8))
    steps = sum(1 / j for j in range(1, 5))
    assert answer["cost"] == pytest.approx(4 * steps + (8 - 1) + steps)
    assert answer["routes"]["4"][:2] == [4, 1]
