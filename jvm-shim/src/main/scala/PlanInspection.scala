package umjoin.spark

import java.util.UUID

import org.json4s.JsonAST._
import org.json4s.jackson.JsonMethods.{compact, parse, render}

import org.apache.spark.SparkEnv
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.catalyst.trees.TreeNode
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.adaptive.{AdaptiveSparkPlanExec, QueryStageExec}

import umjoin.spark.order.{CostModel, CycleStatistics, ProbeGraph, ProbeOrder, ProbeOrderPolicy, ProbeRoute, Smoothing, StatisticsHistory, StoreStructure}
import umjoin.spark.planning.{CostGraph, InputLabels, JoinSizes, LogicalPatterns, ProbeCost, StreamingUMJoinRule}
import umjoin.spark.state.{CacheModel, KeyStatistics, StreamRateForecast}
import umjoin.spark.tsc.{MultiJoin, TwoStepConvert}

/** What the Python side asks the JVM about plans and probe orders; every answer is JSON. */
object PlanInspection {

  /**
   * `{"nodes": [...], "text": [...], "metrics": [...], "subqueries": [...]}`: the plan's nodes in
   * pre-order as TreeNode JSON (each with its number of children), and for each node in the same
   * order its one-line description, its SQL metrics (display name -> value; physical plans only) and
   * the descriptions of its subqueries' plans. AQE's wrappers (adaptive plan, query stages) are seen
   * through, never copied, so the metrics are those of the nodes that ran.
   */
  def describe[T <: TreeNode[T]](plan: T): String = compact(render(description(plan)))

  private def description[T <: TreeNode[T]](plan: T): JValue = {
    val nodes, text, metrics, subqueries = scala.collection.mutable.ArrayBuffer[JValue]()
    def visit(node: TreeNode[_]): Unit = {
      val shown = seeThrough(node)
      // The node's own entry: the first of its subtree's JSON (its children are described as visited).
      nodes += (parse(shown.toJSON) match { case JArray(self :: _) => self; case other => other })
      text += JString(shown.simpleString(25))
      shown match {
        case p: SparkPlan =>
          metrics += JObject(p.metrics.toList.sortBy(_._1).map { case (_, m) => m.name.getOrElse(m.id.toString) -> JLong(m.value) })
          subqueries += JArray(p.subqueries.map(s => description(s)).toList)
        case p: LogicalPlan =>
          metrics += JObject()
          subqueries += JArray(p.subqueries.map(s => description(s)).toList)
        case _ =>
          metrics += JObject()
          subqueries += JArray(Nil)
      }
      shown.children.foreach(child => visit(child.asInstanceOf[TreeNode[_]]))
    }
    visit(plan)
    JObject("nodes" -> JArray(nodes.toList), "text" -> JArray(text.toList), "metrics" -> JArray(metrics.toList),
      "subqueries" -> JArray(subqueries.toList))
  }

  /** The node that ran in place of an AQE wrapper (the current plan of an adaptive plan, a stage's plan). */
  private def seeThrough(node: TreeNode[_]): TreeNode[_] = node match {
    case adaptive: AdaptiveSparkPlanExec => seeThrough(adaptive.executedPlan)
    case stage: QueryStageExec => seeThrough(stage.plan)
    case other => other
  }

  /** Why joins of a streaming query run stayed as Spark planned them (`StreamingQuery.runId`): a JSON array of messages. */
  def unconvertedStreamingJoins(runId: String): String =
    compact(render(JArray(StreamingUMJoinRule.unconverted(UUID.fromString(runId)).map(JString(_)).toList)))

  /**
   * Runs both TSC steps on a logical plan with the session's batch member patterns, without any
   * planning decision: `{"groups": [{"root", "members", "inputs"}], "converted": <describe of the
   * plan with MultiJoin nodes>}`.
   */
  def twoStepConvert(plan: LogicalPlan): String = {
    val patterns = UMJoinExtensions.loadBatchPatterns(Option(SparkEnv.get).flatMap(_.conf.getOption(UMJoinConf.RulesDir)))
    val tsc = new TwoStepConvert[LogicalPlan](patterns.roleOf, LogicalPatterns.keptAsInput)
    val groups = tsc.createMultiJoinGroups(plan)
    val converted = tsc.getMultiJoinNode(plan, groups, (group, inputs) => MultiJoin(inputs, group.root.output))
    val groupJson = groups.map { g =>
      JObject(
        "root" -> JString(g.root.simpleString(25)),
        "members" -> JArray(g.members.map(m => JString(m.nodeName)).toList),
        "inputs" -> JArray(g.inputs.map(i => JString(InputLabels.of(i))).toList))
    }
    compact(render(JObject("groups" -> JArray(groupJson.toList), "converted" -> description(converted))))
  }

  /**
   * The route a probe-order policy chooses from each start input, for given statistics:
   * request `{"policy", "inputs": n, "edges": [[from, to]], "structure": "hash" | "sorted",
   * "queryCost", "matchCost", "gamma": [[from, to, value]], "mu": [[from, to, value]], "kappa": [..n]}`,
   * answer `{"<start>": {"order": [inputs], "edges": [[from, to]], "cost": Eq. 8 cost}}`.
   */
  def probeRoutes(request: String): String = {
    val json = parse(request)
    val policy = ProbeOrderPolicy.byName.getOrElse(stringOf(json \ "policy"),
      throw new IllegalArgumentException(s"unknown policy; expected one of ${ProbeOrderPolicy.byName.keys.toSeq.sorted.mkString(", ")}"))
    val n = intOf(json \ "inputs")
    val graph = ProbeGraph(n, pairs(json \ "edges"))
    val structure = if (stringOf(json \ "structure") == "sorted") StoreStructure.Sorted else StoreStructure.Hash
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
   * policies make it: request `{"cycles": [{"gamma", "mu", "kappa"}], "smoothing": {"alpha", "beta",
   * "damping"} | null}`, answer `{"gamma", "mu", "kappa"}` in the same form.
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
      case s: JObject => Some(Smoothing(doubleOf(s \ "alpha"), doubleOf(s \ "beta"), doubleOf(s \ "damping")))
      case _ => None
    }
    val f = history.forecast(smoothing)
    def triples(m: Map[(Int, Int), Double]) = JArray(m.toList.sorted.map { case ((a, b), v) => JArray(List(JInt(a), JInt(b), JDouble(v))) })
    compact(render(JObject("gamma" -> triples(f.matchRate), "mu" -> triples(f.matchesPerSuccess), "kappa" -> JArray(f.keys.map(JDouble(_)).toList))))
  }

  /**
   * The probe-cost model of streaming groups (paper 002, Eq. 1, [[ProbeCost]]). Request `{"groups":
   * [{"names": [..n], "classes": [[inputs]], "candidates": [[classes] per input; [] = broadcast],
   * "starts": [inputs], "rates": [..n], "distinct": [per class]}], "partitions": p, "jointly": bool}`;
   * answer `{"groups": [{"partitioning": [class or null], "routes": {"<start>": [order]}, "cost"}],
   * "jointly": {"cost", "routes": [{"<start>": [order]}]}}`: each group optimised alone, and with
   * `jointly` all together with shared route prefixes paid once (exhaustive over all routes, for
   * small examples; partitioning left out, as in the paper's example).
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
        val graph = CostGraph(names.size, lists("classes").map(_.toSet), lists("candidates"), ints(g \ "starts"))
        (graph, names, JoinSizes(numbers("rates"), numbers("distinct")))
      }
      case other => bad("groups", other)
    }
    def routesJson(routes: Map[Int, ProbeRoute]): JValue =
      JObject(routes.toList.sortBy(_._1).map { case (s, r) => s.toString -> JArray(r.order.map(i => JInt(i)).toList) })
    val alone = groups.map { case (graph, _, sizes) =>
      val choice = ProbeCost.optimize(graph, sizes, partitions)
      JObject(
        "partitioning" -> JArray(choice.partitioning.map(_.map(c => JInt(c): JValue).getOrElse(JNull)).toList),
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
   * Paper 003's cache choice on given statistics: request `{"model": {"masterRowBytes",
   * "streamRowBytes", "hysteresis", "maxBytes"}, "keys": [{"key", "masterRows", "streamRows",
   * "cached"}]}`, answer `{"cached": [key], "cacheBytes", "memoryBytes"}` (the keys chosen, the
   * cache's bytes, and the memory of every key where the choice puts it).
   */
  def staticCache(request: String): String = {
    val json = parse(request)
    val model = json \ "model"
    val cacheModel = CacheModel(doubleOf(model \ "masterRowBytes"), doubleOf(model \ "streamRowBytes"),
      doubleOf(model \ "hysteresis"), doubleOf(model \ "maxBytes").toLong)
    val (keys, cachedNow) = (json \ "keys") match {
      case JArray(items) => items.map { k =>
        (KeyStatistics(intOf(k \ "key"), intOf(k \ "masterRows").toLong, doubleOf(k \ "streamRows")), k \ "cached" == JBool(true))
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

  /** n(j) after each batch of `{"alpha", "batches": [{"<key>": rows}]}`: `[{"<key>": rate}]`, one object per batch. */
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
      case JArray(items) => items.map { case JArray(List(a, b, v)) => (intOf(a), intOf(b)) -> doubleOf(v); case other => bad(field, other) }.toMap
      case _ => Map.empty
    }
    val keys = json \ "kappa" match {
      case JArray(items) => items.map(doubleOf).toIndexedSeq
      case other => bad("kappa", other)
    }
    CycleStatistics(byPair("gamma"), byPair("mu"), keys)
  }

  private def pairs(json: JValue): Seq[(Int, Int)] = json match {
    case JArray(items) => items.map { case JArray(List(a, b)) => (intOf(a), intOf(b)); case other => bad("edges", other) }
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
