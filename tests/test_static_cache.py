"""Paper 003 (SSBJ)'s choice of the static input's keys kept in memory, on hand-made statistics: the
cache inequality m * v_R < n * v_S (Theorem 2), the least memory (Theorem 1: the sum over keys of
min(cache cost, disk cost), and no other set of keys needs less), the hysteresis factor s_f, the
memory bound, and the forecast n(j) of each key's stream rows per batch; and the bounds of an executor's caches
(least recently used first)."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest
from pyspark.sql import SparkSession

UNBOUNDED = 1e18


def choose(spark: SparkSession, keys: list[dict[str, Any]], v_r: float, v_s: float, hysteresis: float = 1.0, max_bytes: float = UNBOUNDED) -> dict[str, Any]:
    model = {"masterRowBytes": v_r, "streamRowBytes": v_s, "hysteresis": hysteresis, "maxBytes": max_bytes}
    return json.loads(spark._jvm.umjoin.spark.testkit.CostModels.staticCache(json.dumps({"model": model, "keys": keys})))


def random_keys(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """Keys with 0-20 master rows (0: a key the static table lacks) and 0-10 expected stream rows."""
    return [{"key": k, "masterRows": rng.choice([0, 1, 1, 2, 3, 5, 20]), "streamRows": rng.choice([0, 0.5, 1, 2, 4, 10]),
             "cached": rng.random() < 0.3} for k in range(count)]


def memory(keys: list[dict[str, Any]], cached: set[int], v_r: float, v_s: float) -> float:
    return sum(k["masterRows"] * v_r if k["key"] in cached else k["streamRows"] * v_s for k in keys)


@pytest.mark.parametrize("seed", range(20))
def test_the_cached_keys_are_those_of_the_cache_inequality_and_need_the_least_memory(spark: SparkSession, seed: int) -> None:
    rng = random.Random(seed)
    keys = random_keys(rng, rng.randint(1, 10))
    v_r, v_s = rng.choice([40.0, 100.0, 250.0]), rng.choice([30.0, 100.0, 400.0])
    answer = choose(spark, keys, v_r, v_s)
    assert set(answer["cached"]) == {k["key"] for k in keys if k["masterRows"] * v_r < k["streamRows"] * v_s}
    assert answer["memoryBytes"] == pytest.approx(sum(min(k["masterRows"] * v_r, k["streamRows"] * v_s) for k in keys))
    assert answer["cacheBytes"] == pytest.approx(sum(k["masterRows"] * v_r for k in keys if k["key"] in answer["cached"]))
    every_choice = (set(c) for r in range(len(keys) + 1) for c in itertools.combinations([k["key"] for k in keys], r))
    assert answer["memoryBytes"] <= min(memory(keys, c, v_r, v_s) for c in every_choice) + 1e-6


def test_a_key_the_static_table_lacks_is_cached_once_the_stream_asks_for_it(spark: SparkSession) -> None:
    keys = [{"key": 1, "masterRows": 0, "streamRows": 0.5, "cached": False}, {"key": 2, "masterRows": 0, "streamRows": 0, "cached": True}]
    answer = choose(spark, keys, 100, 100)
    assert answer["cached"] == [1] and answer["cacheBytes"] == 0


def test_hysteresis_keeps_a_key_near_the_balance_where_it_is(spark: SparkSession) -> None:
    # Disk cost 1.5x the cache cost: inside the band of s_f = 2 (neither 2x more nor 2x less).
    near = {"masterRows": 2, "streamRows": 3}
    far_in = {"masterRows": 1, "streamRows": 5}  # disk 5x the cache: enters
    far_out = {"masterRows": 10, "streamRows": 1}  # cache 10x the disk: leaves
    keys = [{"key": 1, **near, "cached": True}, {"key": 2, **near, "cached": False},
            {"key": 3, **far_in, "cached": False}, {"key": 4, **far_out, "cached": True}]
    assert choose(spark, keys, 100, 100, hysteresis=2)["cached"] == [1, 3]
    # Without hysteresis both near keys are cached (1.5 * 100 * 2 > 100 * 2).
    assert choose(spark, keys, 100, 100, hysteresis=1)["cached"] == [1, 2, 3]


@pytest.mark.parametrize("seed", range(10))
def test_the_memory_bound_takes_whole_keys_most_saving_first(spark: SparkSession, seed: int) -> None:
    rng = random.Random(100 + seed)
    keys = random_keys(rng, 30)
    admitted = [k for k in keys if k["masterRows"] * 100 < k["streamRows"] * 100]
    bound = rng.uniform(0, sum(k["masterRows"] * 100 for k in admitted))
    answer = choose(spark, keys, 100, 100, max_bytes=bound)
    chosen = set(answer["cached"])
    assert chosen <= {k["key"] for k in admitted}
    assert answer["cacheBytes"] <= bound
    # Every admitted key left out would not fit beside the chosen ones.
    for k in admitted:
        if k["key"] not in chosen:
            assert answer["cacheBytes"] + k["masterRows"] * 100 > bound
    # The keys saving the most disk bytes per cached byte come first: one of them is taken when the
    # cheapest of them fits alone (keys the static table lacks cost nothing, so they always are).
    def saving(k: dict[str, Any]) -> float:
        return k["streamRows"] / k["masterRows"] if k["masterRows"] else float("inf")
    if admitted:
        best = max(saving(k) for k in admitted)
        tops = [k for k in admitted if saving(k) == best]
        if min(k["masterRows"] * 100 for k in tops) <= bound:
            assert chosen & {k["key"] for k in tops}


def test_the_stream_rate_forecast_smooths_and_forgets(spark: SparkSession) -> None:
    request = {"alpha": 0.5, "batches": [{"a": 4}, {"b": 2}, {"a": 4, "b": 2}] + [{}] * 12}
    after = json.loads(spark._jvm.umjoin.spark.testkit.CostModels.streamRates(json.dumps(request)))
    assert after[0] == {"a": 2.0}
    assert after[1] == {"a": 1.0, "b": 1.0}
    assert after[2] == {"a": 2.5, "b": 1.5}
    assert after[3] == {"a": 1.25, "b": 0.75}
    assert after[-1] == {}, "keys the stream stopped asking for are forgotten"


def test_a_hysteresis_factor_below_one_is_refused_with_its_value(spark: SparkSession) -> None:
    with pytest.raises(Exception, match="hysteresis factor is at least 1, not 0.5"):
        choose(spark, [], 100, 100, hysteresis=0.5)


def held_after_each_step(spark: SparkSession, max_entries: int, max_weight: int, steps: list[list[Any]]) -> list[list[str]]:
    request = {"maxEntries": max_entries, "maxWeight": max_weight, "steps": steps}
    return json.loads(spark._jvm.umjoin.spark.testkit.CacheBounds.held(json.dumps(request)))  # type: ignore[union-attr]


def test_an_executors_cache_drops_the_least_recently_used_entry_past_its_count(spark: SparkSession) -> None:
    """The stores' committed row counts are kept for the most recently used stores (a count dropped costs a probe
    of the store, never an answer). Two entries at most: a read keeps `a`, so `b` goes when `c` comes."""
    steps = [["a", 0], ["b", 0], ["a"], ["c", 0]]
    assert held_after_each_step(spark, 2, 2**62, steps) == [["a"], ["a", "b"], ["b", "a"], ["a", "c"]]


def test_an_executors_static_caches_drop_the_least_recently_used_past_their_bytes(spark: SparkSession) -> None:
    """Static tables' caches take at most a bound of bytes in all (a tenth of the heap): past it the least recently
    used go first, never the one just made, even when it alone passes the bound."""
    steps = [["a", 4], ["b", 4], ["c", 4], ["d", 20]]
    assert held_after_each_step(spark, 1000, 10, steps) == [["a"], ["a", "b"], ["b", "c"], ["d"]]
