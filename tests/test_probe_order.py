"""Probe-order policies (paper 001): dpPick against brute force, the forecast against hand-computed
series, and answers that do not depend on the policy or on route changes while a task runs."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pyspark.sql import SparkSession

from conftest import TPCH_SF, UMJOIN_TPCH_QUERIES
from umjoin import answers, plans, tpch
from umjoin.local import temporary_conf

ADAPTIVE = ("selectivityFirst", "greedy", "dpPick")
# Re-choose the route every 50 streamed rows of a task: under dpPick at SF 0.01, Q2, Q5, Q7, Q8, Q9 and Q21 change
# routes while they run (the same six as every 7 rows, where dpPick's test took 39 s instead of 15).
REROUTE_OFTEN = {"spark.umjoin.dpPick.cycleRows": "50", "spark.umjoin.dpPick.history": "3"}

Edge = tuple[int, int]


# --- Eq. 8 and Algorithm 4, written out independently of the JVM's implementation -------------


def query_cost(keys: float, structure: str) -> float:
    """Eq. 5 (hash table with at least twice the keys in slots, at least 64) and Eq. 6 (sorted)."""
    import math

    if structure == "hash":
        return 1.0 + keys / (2 * max(64.0, 2 * keys))
    return math.log(max(keys, 1.0))


def observed(values: dict[Edge, float], edge: Edge) -> float:
    """A pair's statistic; unobserved: the mean over the pairs observed into the same store, else 1."""
    if edge in values:
        return values[edge]
    same_store = [v for (_, to), v in values.items() if to == edge[1]]
    return sum(same_store) / len(same_store) if same_store else 1.0


def sequence_cost(edges: list[Edge], stats: dict[str, Any], alpha_q: float, alpha_m: float, structure: str) -> float:
    """C(o_1) by Eq. 8, unrolled: each step's cost counts only if every step before it matched."""
    total, reach = 0.0, 1.0
    for frm, to in edges:
        gamma = observed(stats["gamma"], (frm, to))
        mu = observed(stats["mu"], (frm, to))
        total += reach * (alpha_q * query_cost(stats["kappa"][to], structure) + gamma * alpha_m * mu)
        reach *= gamma
    return total


def all_sequences(n: int, edges: list[Edge], start: int) -> list[list[Edge]]:
    """Every edge sequence from `start` that binds each input once, each edge from a bound input."""
    found: list[list[Edge]] = []

    def extend(bound: set[int], sequence: list[Edge]) -> None:
        if len(bound) == n:
            found.append(sequence)
        for frm, to in edges:
            if frm in bound and to not in bound:
                extend(bound | {to}, sequence + [(frm, to)])

    extend({start}, [])
    return found


GRAPHS = {
    "chain": lambda n: [(i, i + 1) for i in range(n - 1)],
    "star": lambda n: [(0, i) for i in range(1, n)],
    "cycle": lambda n: [(i, (i + 1) % n) for i in range(n)],
    "clique": lambda n: [(i, j) for i in range(n) for j in range(i + 1, n)],
}


def random_statistics(rng: random.Random, n: int, edges: list[Edge]) -> dict[str, Any]:
    pairs = edges + [(b, a) for a, b in edges]
    return {
        "gamma": {p: rng.choice([0.0, rng.random(), 1.0, rng.random() ** 3]) for p in pairs if rng.random() < 0.9},
        "mu": {p: rng.choice([1.0, 1 + rng.random() * 20, rng.random() * 500]) for p in pairs if rng.random() < 0.9},
        "kappa": [rng.choice([0, 1, rng.randint(2, 10**7)]) for _ in range(n)],
    }


def probe_routes(spark: SparkSession, policy: str, n: int, edges: list[Edge], stats: dict[str, Any], alpha_q: float, alpha_m: float, structure: str) -> dict[int, dict[str, Any]]:
    request = {
        "policy": policy,
        "inputs": n,
        "edges": [list(e) for e in edges] + [[b, a] for a, b in edges],
        "structure": structure,
        "queryCost": alpha_q,
        "matchCost": alpha_m,
        "gamma": [[a, b, v] for (a, b), v in stats["gamma"].items()],
        "mu": [[a, b, v] for (a, b), v in stats["mu"].items()],
        "kappa": stats["kappa"],
    }
    answer = json.loads(spark._jvm.umjoin.spark.testkit.CostModels.probeRoutes(json.dumps(request)))
    return {int(start): route for start, route in answer.items()}


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("structure", ["hash", "sorted"])
def test_dp_pick_finds_the_least_cost_sequence(spark: SparkSession, graph: str, structure: str) -> None:
    rng = random.Random(f"{graph}-{structure}")
    for _ in range(15):
        n = rng.randint(3, 5)
        edges = GRAPHS[graph](n)
        both_ways = edges + [(b, a) for a, b in edges]
        stats = random_statistics(rng, n, edges)
        alpha_q, alpha_m = rng.choice([(1.0, 1.0), (0.0, 1.0), (1.0, 0.0), (0.3, 2.5)])
        chosen = probe_routes(spark, "dpPick", n, edges, stats, alpha_q, alpha_m, structure)
        others = {p: probe_routes(spark, p, n, edges, stats, alpha_q, alpha_m, structure) for p in ("fixed", "selectivityFirst", "greedy")}
        assert sorted(chosen) == list(range(n))
        for start in range(n):
            candidates = all_sequences(n, both_ways, start)
            best = min(sequence_cost(s, stats, alpha_q, alpha_m, structure) for s in candidates)
            route = [tuple(e) for e in chosen[start]["edges"]]
            assert route in candidates, f"dpPick returned an invalid sequence {route} from {start}"
            own = sequence_cost(route, stats, alpha_q, alpha_m, structure)
            assert own == pytest.approx(best, rel=1e-9, abs=1e-12), f"{graph} from {start}: {route} costs {own}, best {best}"
            assert chosen[start]["cost"] == pytest.approx(own, rel=1e-9, abs=1e-12)
            for policy, routes in others.items():  # every other policy's route is valid and no cheaper
                other = [tuple(e) for e in routes[start]["edges"]]
                assert other in candidates, f"{policy} returned an invalid sequence {other}"
                assert sequence_cost(other, stats, alpha_q, alpha_m, structure) >= best - 1e-9


def test_greedy_and_selectivity_first_take_their_cheapest_next_step(spark: SparkSession) -> None:
    # A star 0-{1,2,3} from 0: store 1 rarely matches but is huge, store 2 often matches few rows,
    # store 3 matches always, many rows. selectivityFirst looks at gamma*mu only; greedy at the step's cost.
    edges = [(0, 1), (0, 2), (0, 3)]
    stats = {
        "gamma": {(0, 1): 0.1, (0, 2): 0.5, (0, 3): 1.0},
        "mu": {(0, 1): 1.0, (0, 2): 1.0, (0, 3): 8.0},
        "kappa": [10, 10**9, 10, 10],
    }
    # sorted stores: f(kappa) = ln(kappa); step costs: to 1: ln(1e9) + 0.1 = 20.8, to 2: ln(10) + 0.5 = 2.8, to 3: 2.3 + 8 = 10.3
    greedy = probe_routes(spark, "greedy", 4, edges, stats, 1.0, 1.0, "sorted")[0]["order"]
    selective = probe_routes(spark, "selectivityFirst", 4, edges, stats, 1.0, 1.0, "sorted")[0]["order"]
    fixed = probe_routes(spark, "fixed", 4, edges, stats, 1.0, 1.0, "sorted")[0]["order"]
    assert selective == [0, 1, 2, 3]  # gamma*mu: 0.1 < 0.5 < 8
    assert greedy == [0, 2, 3, 1]  # 2.8 < 10.3 < 20.8
    assert fixed == [0, 1, 2, 3]  # the plan's order: leftmost connected input


def forecast(spark: SparkSession, cycles: list[dict[str, Any]], smoothing: dict[str, float] | None) -> dict[str, Any]:
    request = {
        "cycles": [
            {"gamma": [[a, b, v] for (a, b), v in c["gamma"].items()], "mu": [[a, b, v] for (a, b), v in c["mu"].items()], "kappa": c["kappa"]}
            for c in cycles
        ],
        "smoothing": smoothing,
    }
    answer = json.loads(spark._jvm.umjoin.spark.testkit.CostModels.forecastStatistics(json.dumps(request)))
    return {
        "gamma": {(a, b): v for a, b, v in answer["gamma"]},
        "mu": {(a, b): v for a, b, v in answer["mu"]},
        "kappa": answer["kappa"],
    }


def test_forecast_matches_hand_computed_holt_series(spark: SparkSession) -> None:
    # kappa 100, 130, 150, 190 with alpha 0.5, beta 0.3 (Holt, no damping); level l, trend b:
    #   start   l = 100, b = 130 - 100 = 30
    #   y = 130 l = .5*130 + .5*(100 + 30)  = 130,    b = .3*(130 - 100) + .7*30       = 30
    #   y = 150 l = .5*150 + .5*(130 + 30)  = 155,    b = .3*(155 - 130) + .7*30       = 28.5
    #   y = 190 l = .5*190 + .5*(155 + 28.5) = 186.75, b = .3*(186.75 - 155) + .7*28.5 = 29.475
    #   next    l + b = 216.225
    # gamma .2, .4, .5, .55 with the damped trend (phi 0.9):
    #   start   l = .2, b = .2
    #   y = .4  l = .5*.4 + .5*(.2 + .18) = .39,            b = .3*(.39 - .2) + .7*.9*.2 = .183
    #   y = .5  l = .5*.5 + .5*(.39 + .1647) = .52735,      b = .3*(.52735 - .39) + .7*.9*.183 = .156495
    #   y = .55 l = .5*.55 + .5*(.52735 + .1408455) = .60910, b = .3*(.60910 - .52735) + .7*.9*.156495 = .123116
    #   next    l + phi*b = .60910 + .110805 = .71990
    # mu 3, 3, 3, 3 stays 3.
    kappas = [100, 130, 150, 190]
    gammas = [0.2, 0.4, 0.5, 0.55]
    cycles = [{"gamma": {(0, 1): g}, "mu": {(0, 1): 3.0}, "kappa": [5, k]} for g, k in zip(gammas, kappas)]
    result = forecast(spark, cycles, {"alpha": 0.5, "beta": 0.3, "damping": 0.9})
    assert result["kappa"][1] == pytest.approx(216.225)
    assert result["kappa"][0] == pytest.approx(5.0)
    assert result["gamma"][(0, 1)] == pytest.approx(0.719903, abs=1e-5)
    assert result["mu"][(0, 1)] == pytest.approx(3.0)


def test_forecast_keeps_rates_in_range_and_without_smoothing_takes_the_last_cycle(spark: SparkSession) -> None:
    rising = [{"gamma": {(0, 1): g}, "mu": {(0, 1): m}, "kappa": [k, 1]} for g, m, k in [(0.5, 4, 30), (0.8, 2, 10), (0.99, 1, 1)]]
    smoothed = forecast(spark, rising, {"alpha": 0.9, "beta": 0.9, "damping": 1.0})
    assert smoothed["gamma"][(0, 1)] == 1.0  # the trend would pass 1: a rate stays a rate
    assert smoothed["mu"][(0, 1)] == 1.0  # a successful probe matches at least one row
    assert smoothed["kappa"][0] == 0.0  # key counts are not negative
    last = forecast(spark, rising, None)
    assert last == {"gamma": {(0, 1): 0.99}, "mu": {(0, 1): 1.0}, "kappa": [1.0, 1.0]}


# --- The policies inside real queries ------------------------------------------------------------


@pytest.mark.parametrize("policy", ADAPTIVE)
def test_every_policy_returns_the_official_tpch_answers(spark: SparkSession, tpch_data: Path, policy: str) -> None:
    settings = {"spark.sql.adaptive.enabled": "true", "spark.umjoin.enabled": "true", "spark.umjoin.probeOrder": policy, **REROUTE_OFTEN}
    route_changes = 0
    with temporary_conf(spark, settings):
        for number in UMJOIN_TPCH_QUERIES:
            columns, expected = tpch.official_answer(number, TPCH_SF)
            sql = tpch.query_text(number)
            df = spark.sql(sql)
            rows = [tuple(r) for r in df.collect()]
            problems = answers.compare(rows, expected, answers.order_by_columns(sql, columns))
            assert problems == [], f"Q{number} ({policy}) differs from the official answer: {problems}"
            route_changes += sum(n.metrics["probe route changes"] for n in plans.umjoin_nodes(plans.physical_plan(df)))
    assert route_changes > 0, f"{policy} never changed a route, so the answers above did not test changes"


def test_dp_pick_on_rocksdb_stores_returns_the_official_answers(spark: SparkSession, tpch_data: Path) -> None:
    settings = {
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.autoBroadcastJoinThreshold": "-1",
        "spark.umjoin.stateBackend": "rocksdb",
        "spark.umjoin.probeOrder": "dpPick",
        **REROUTE_OFTEN,
    }
    with temporary_conf(spark, settings):
        for number in (2, 5, 7, 8, 9, 21):
            columns, expected = tpch.official_answer(number, TPCH_SF)
            sql = tpch.query_text(number)
            problems = answers.compare([tuple(r) for r in spark.sql(sql).collect()], expected, answers.order_by_columns(sql, columns))
            assert problems == [], f"Q{number} (dpPick, rocksdb) differs from the official answer: {problems}"


def _write_shifting_tables(directory: Path) -> None:
    """S streams 20,000 rows in file order; A and B are probed by S.a and S.b. In the first half
    A almost never matches and B always does; in the second half the other way round."""
    con = duckdb.connect()
    con.execute("""
        CREATE TABLE s AS SELECT i AS id,
          CASE WHEN i < 10000 THEN (CASE WHEN i % 50 = 0 THEN i % 100 ELSE 1000 + i END) ELSE i % 100 END AS a,
          CASE WHEN i < 10000 THEN i % 100 ELSE (CASE WHEN i % 50 = 0 THEN i % 100 ELSE 1000 + i END) END AS b
        FROM range(20000) t(i) ORDER BY i""")
    con.execute("CREATE TABLE a AS SELECT i AS a, i * 10 AS va FROM range(100) t(i)")
    con.execute("CREATE TABLE b AS SELECT i AS b, i * 100 AS vb FROM range(100) t(i)")
    con.execute("CREATE TABLE c AS SELECT i AS a, i % 7 AS vc FROM range(100) t(i), range(2) u(j)")
    for table in ("s", "a", "b", "c"):
        con.execute(f"COPY {table} TO '{directory / table}.parquet' (FORMAT parquet, ROW_GROUP_SIZE 100000)")
    con.close()


SHIFT_SQL = """SELECT s.id, a.va, b.vb, c.vc FROM shift_s s JOIN shift_a a ON s.a = a.a
               JOIN shift_b b ON s.b = b.b JOIN shift_c c ON c.a = a.a"""


@pytest.fixture(scope="module")
def shifting_views(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("shifting")
    _write_shifting_tables(directory)
    for table in ("s", "a", "b", "c"):
        spark.read.parquet(str(directory / f"{table}.parquet")).createOrReplaceTempView(f"shift_{table}")
    return directory


def test_route_changes_inside_a_task_lose_and_duplicate_no_row(spark: SparkSession, shifting_views: Path) -> None:
    con = duckdb.connect()
    for table in ("s", "a", "b", "c"):
        con.execute(f"CREATE VIEW shift_{table} AS SELECT * FROM '{shifting_views / table}.parquet'")
    expected = sorted(con.execute(SHIFT_SQL).fetchall())
    assert len(expected) == 2 * 400  # 400 rows of s find a and b; c has two rows per key
    settings = {"spark.sql.adaptive.enabled": "false", "spark.umjoin.probeOrder": "dpPick",
                "spark.umjoin.dpPick.cycleRows": "500", "spark.umjoin.dpPick.history": "2"}
    with temporary_conf(spark, settings):
        df = spark.sql(SHIFT_SQL)
        actual = sorted(tuple(r) for r in df.collect())
        (node,) = plans.umjoin_nodes(plans.physical_plan(df))
    assert actual == expected
    # S streams in one task; its first half favours probing A early, its second half B: the route
    # changed while that task ran.
    assert node.inputs[node.probe_order[0]].label == "s"
    assert node.metrics["probe route changes"] >= 1, node.metrics


# --- The arrival replay behind `make bench-probe-order` ----------------------------------------

def test_arrival_replay_gives_sparks_rows_under_every_policy_and_backend(spark: SparkSession, shifting_views: Path) -> None:
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        replay = spark.sparkContext._jvm.umjoin.spark.testkit.ArrivalReplay.prepare(spark.sql(SHIFT_SQL)._jdf)
        try:
            # <input label>.<column>; the inputs are files s, a, b, c, which the query aliases by the same letters.
            columns = replay.resultColumns()
            runs = [{"initialOrder": ["c", "b", "a", "s"],
                     "conf": {"spark.umjoin.probeOrder": policy, "spark.umjoin.stateBackend": backend,
                              "spark.umjoin.dpPick.cycleRows": "97", "spark.umjoin.dpPick.history": "3"}}
                    for policy in ("fixed", *ADAPTIVE) for backend in ("memory", "rocksdb")]
            results = json.loads(replay.replayJson(json.dumps({"seed": 7, "checksum": True, "runs": runs})))
        finally:
            replay.release()
        # The same rows from Spark's own plan: their count and the same checksum over the same columns.
        with temporary_conf(spark, {"spark.umjoin.enabled": "false"}):
            where = SHIFT_SQL[SHIFT_SQL.index(" FROM "):]
            count, checksum = spark.sql(f"SELECT count(*), sum(xxhash64({columns}) & 4294967295){where}").first()
    assert count == 800
    assert [(r["rows"], r["checksum"]) for r in results] == [(count, checksum)] * len(runs)
    changes = {run["conf"]["spark.umjoin.probeOrder"]: result["routeChanges"] for run, result in zip(runs, results)}
    assert changes["fixed"] == 0 and changes["dpPick"] > 0, changes


def test_arrival_replay_explains_what_it_cannot_replay(spark: SparkSession, shifting_views: Path) -> None:
    jvm_replay = spark.sparkContext._jvm.umjoin.spark.testkit.ArrivalReplay
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "true"}):
        with pytest.raises(Exception, match="set spark.sql.adaptive.enabled=false"):
            jvm_replay.prepare(spark.sql(SHIFT_SQL)._jdf)
    with temporary_conf(spark, {"spark.sql.adaptive.enabled": "false"}):
        with pytest.raises(Exception, match="has no UMJoin to replay"):
            jvm_replay.prepare(spark.sql("SELECT * FROM shift_a")._jdf)
        replay = jvm_replay.prepare(spark.sql(SHIFT_SQL)._jdf)
        try:
            assert sorted(replay.labelList().split(",")) == ["a", "b", "c", "s"]
            with pytest.raises(Exception, match="unknown input 'orders'"):
                replay.replayJson(json.dumps({"runs": [{"initialOrder": ["orders", "b", "a", "s"]}]}))
            with pytest.raises(Exception, match="Invalid value 'soon' for spark.umjoin.probeOrder"):
                replay.replayJson(json.dumps({"runs": [{"initialOrder": ["c", "b", "a", "s"],
                                                        "conf": {"spark.umjoin.probeOrder": "soon"}}]}))
        finally:
            replay.release()
