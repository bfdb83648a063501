package umjoin.spark.testkit

import org.json4s.JsonAST._
import org.json4s.jackson.JsonMethods.{compact, parse, render}

import umjoin.spark.core.cost.{CacheModel, CostGraph, CostModel, CycleStatistics, JoinSizes,
  KeyStatistics, ProbeCost, ProbeGraph, ProbeOrder, ProbeOrderPolicy, Smoothing, StatisticsHistory,
  StoreStructure, StreamRateForecast}
import umjoin.spark.core.probe.Route

/**
 * The cost models, asked directly by the tests (not part of the UMJoin jar: the testkit jar is
 * built for the test suite and the benchmarks): probe-order policies, their forecast, CLASH's probe
 * cost (paper 002), SSBJ's cache choice (paper 003). Requests and answers are JSON.
 */
object CostModels {

  /**
   * The route a probe-order policy chooses from each start input, for given statistics:
   * request `{"policy", "inputs": n, "edges": [[from, to]], "structure": "hash" | "sorted",
   * "queryCost", "matchCost", "gamma": [[from, to, value]], "mu": [[from, to, value]], "kappa":
   * [..n]}`, answer `{"<start>": {"order": [inputs], "edges": [[from, to]], "cost": Eq. 8 cost}}`.
   */
  def probeRoutes(request: String): String = {
    val json = parse(request)
    val policy = ProbeOrderPolicy.byName.getOrElse(stringOf(json \ "policy"),
      throw new IllegalArgumentException("unknown policy; expected one of " +
        s"${ProbeOrderPolicy.byName.keys.toSeq.sorted.mkString(", ")}"))
    val n = intOf(json \ "inputs")
    val graph = ProbeGraph(n, pairs(json \ "edges"))
    val structure =
      if (stringOf(json \ "structure") == "sorted") StoreStructure.Sorted else StoreStructure.Hash
    val cost = CostModel(doubleOf(json \ "queryCost"), doubleOf(json \ "matchCost"), structure)
    val stats = statistics(json)
    val routes = policy.routes(graph, stats, cost, 0 until n)
    compact(render(JObject(routes.toList.sortBy(_._1).map { case (start, route) =>
      start.toString -> JObject(
        "order" -> JArray(route.order.map(i => JInt(i)).toList),
        "edges" -> JArray(route.edges.map { case (f, t) => JArray(List(JInt(f), JInt(t))) }.toList),
        "cost" -> JDouble(ProbeOrder.cost(route, stats, cost)))
    })))
  }

  /**
   * The forecast of the next cycle's statistics from past cycles (oldest first), as the adaptive
   * policies make it: request `{"cycles": [{"gamma", "mu", "kappa"}], "smoothing": {"alpha",
   * "beta", "damping"} | null}`, answer `{"gamma", "mu", "kappa"}` in the same form.
   */
  def forecastStatistics(request: String): String = {
    val json = parse(request)
    val cycles = json \ "cycles" match {
      case JArray(items) => items.map(statistics)
      case _ => Nil
    }
    val history = new StatisticsHistory(math.max(1, cycles.size))
    cycles.foreach(history.add)
    val smoothing = json \ "smoothing" match {
      case s: JObject =>
        Some(Smoothing(doubleOf(s \ "alpha"), doubleOf(s \ "beta"), doubleOf(s \ "damping")))
      case _ => None
    }
    val f = history.forecast(smoothing)
    def triples(m: Map[(Int, Int), Double]) =
      JArray(m.toList.sorted.map { case ((a, b), v) => JArray(List(JInt(a), JInt(b), JDouble(v))) })
    compact(render(JObject("gamma" -> triples(f.matchRate), "mu" -> triples(f.matchesPerSuccess),
      "kappa" -> JArray(f.keys.map(JDouble(_)).toList))))
  }

  /**
   * The probe-cost model of streaming groups (CLASH paper 002, Eq. 1, [[ProbeCost]]). Request
   * `{"groups": [{"names": [..n], "classes": [[inputs]], "candidates": [[classes] per input; [] =
   * broadcast], "starts": [inputs], "rates": [..n], "distinct": [per class]}], "partitions": p,
   * "jointly": bool}`; answer `{"groups": [{"partitioning": [class or null], "routes": {"<start>":
   * [order]}, "cost"}], "jointly": {"cost", "routes": [{"<start>": [order]}]}}`: each group
   * optimised alone, and with `jointly` all together with shared route prefixes paid once
   * (exhaustive over all routes, for small examples; partitioning left out, as in the paper's
   * example).
   */
  def probeCost(request: String): String = {
    val json = parse(request)
    val partitions = intOf(json \ "partitions")
    val groups = (json \ "groups") match {
      case JArray(items) => items.map { g =>
        def ints(v: JValue): Seq[Int] = v match {
          case JArray(xs) => xs.map(intOf)
          case other => bad("a list of integers", other)
        }
        def lists(field: String): IndexedSeq[Seq[Int]] = g \ field match {
          case JArray(xs) => xs.map(ints).toIndexedSeq
          case other => bad(field, other)
        }
        def numbers(field: String): IndexedSeq[Double] = g \ field match {
          case JArray(xs) => xs.map(doubleOf).toIndexedSeq
          case other => bad(field, other)
        }
        val names = g \ "names" match {
          case JArray(xs) => xs.map(stringOf).toIndexedSeq
          case other => bad("names", other)
        }
        val graph = CostGraph(names.size, lists("classes").map(_.toSet), lists("candidates"),
          ints(g \ "starts"))
        (graph, names, JoinSizes(numbers("rates"), numbers("distinct")))
      }
      case other => bad("groups", other)
    }
    def routesJson(routes: Map[Int, Route]): JValue =
      JObject(routes.toList.sortBy(_._1)
        .map { case (s, r) => s.toString -> JArray(r.order.map(i => JInt(i)).toList) })
    val alone = groups.map { case (graph, _, sizes) =>
      val choice = ProbeCost.optimize(graph, sizes, partitions)
      JObject(
        "partitioning" ->
          JArray(choice.partitioning.map(_.map(c => JInt(c): JValue).getOrElse(JNull)).toList),
        "routes" -> routesJson(choice.routes),
        "cost" -> JDouble(choice.cost))
    }
    val jointly = json \ "jointly" match {
      case JBool(true) =>
        val (cost, routes) = ProbeCost.optimizeJointly(groups)
        JObject("cost" -> JDouble(cost), "routes" -> JArray(routes.map(routesJson).toList))
      case _ => JNull
    }
    compact(render(JObject("groups" -> JArray(alone.toList), "jointly" -> jointly)))
  }

  /**
   * SSBJ's cache choice (paper 003) on given statistics: request `{"model": {"masterRowBytes",
   * "streamRowBytes", "hysteresis", "maxBytes"}, "keys": [{"key", "masterRows", "streamRows",
   * "cached"}]}`, answer `{"cached": [key], "cacheBytes", "memoryBytes"}` (the keys chosen, the
   * cache's bytes, and the memory of every key where the choice puts it).
   */
  def staticCache(request: String): String = {
    val json = parse(request)
    val model = json \ "model"
    val cacheModel =
      CacheModel(doubleOf(model \ "masterRowBytes"), doubleOf(model \ "streamRowBytes"),
        doubleOf(model \ "hysteresis"), doubleOf(model \ "maxBytes").toLong)
    val (keys, cachedNow) = (json \ "keys") match {
      case JArray(items) => items.map { k =>
        (KeyStatistics(intOf(k \ "key"), intOf(k \ "masterRows").toLong,
          doubleOf(k \ "streamRows")), k \ "cached" == JBool(true))
      }.unzip
      case other => bad("keys", other)
    }
    val before = keys.zip(cachedNow).collect { case (k, true) => k.key }.toSet
    val chosen = cacheModel.choose(keys, before)
    compact(render(JObject(
      "cached" -> JArray(chosen.toList.sorted.map(k => JInt(k))),
      "cacheBytes" -> JDouble(keys.filter(k => chosen(k.key)).map(cacheModel.cacheBytes).sum),
      "memoryBytes" -> JDouble(cacheModel.memoryBytes(keys, chosen)))))
  }

  /**
   * n(j) after each batch of `{"alpha", "batches": [{"<key>": rows}]}`: `[{"<key>": rate}]`, one
   * object per batch.
   */
  def streamRates(request: String): String = {
    val json = parse(request)
    val forecast = new StreamRateForecast[String](doubleOf(json \ "alpha"))
    val after = (json \ "batches") match {
      case JArray(batches) => batches.map {
        case JObject(counts) =>
          forecast.observe(counts.map { case (k, v) => k -> intOf(v).toLong }.toMap)
          JObject(forecast.keys.toList.sorted.map(k => k -> JDouble(forecast.rate(k))))
        case other => bad("a batch's counts", other)
      }
      case other => bad("batches", other)
    }
    compact(render(JArray(after)))
  }

  private def statistics(json: JValue): CycleStatistics = {
    def byPair(field: String): Map[(Int, Int), Double] = json \ field match {
      case JArray(items) => items.map { case JArray(List(a, b, v)) => (intOf(a), intOf(b)) ->
        doubleOf(v); case other => bad(field, other)
      }.toMap
      case _ => Map.empty
    }
    val keys = json \ "kappa" match {
      case JArray(items) => items.map(doubleOf).toIndexedSeq
      case other => bad("kappa", other)
    }
    CycleStatistics(byPair("gamma"), byPair("mu"), keys)
  }

  private def pairs(json: JValue): Seq[(Int, Int)] = json match {
    case JArray(items) => items.map {
      case JArray(List(a, b)) => (intOf(a), intOf(b)); case other => bad("edges", other)
    }
    case other => bad("edges", other)
  }

  private def intOf(v: JValue): Int = v match {
    case JInt(i) => i.toInt
    case other => bad("an integer", other)
  }

  private def doubleOf(v: JValue): Double = v match {
    case JInt(i) => i.toDouble
    case JDouble(d) => d
    case JDecimal(d) => d.toDouble
    case other => bad("a number", other)
  }

  private def stringOf(v: JValue): String = v match {
    case JString(s) => s
    case other => bad("a string", other)
  }

  private def bad(what: String, value: JValue): Nothing =
    throw new IllegalArgumentException(s"expected $what, found ${compact(render(value))}")
}
