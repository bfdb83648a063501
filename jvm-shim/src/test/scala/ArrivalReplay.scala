package umjoin.spark.testkit

import scala.collection.mutable

import org.json4s.JsonAST._
import org.json4s.jackson.JsonMethods.{compact, parse, render}

import org.apache.spark.TaskContext
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.{Dataset, Row}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, UnsafeProjection, XxHash64}
import org.apache.spark.sql.execution.{InputAdapter, SparkPlan}
import org.apache.spark.sql.execution.adaptive.AdaptiveSparkPlanExec
import org.apache.spark.sql.execution.exchange.{BroadcastExchangeLike, ShuffleExchangeLike}
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.storage.StorageLevel

import umjoin.spark.UMJoinConf
import umjoin.spark.batch.UMJoinExec
import umjoin.spark.core.JoinGraph
import umjoin.spark.core.cost.{AdaptiveRouter, ProbeCounters, ProbeOrder, StoreStructure}
import umjoin.spark.core.probe.{CompiledRoute, InputMetrics, ProbeCore, ProbeSteps,
  Route, StoreIndex}
import umjoin.spark.core.store.{AppendableStore, JoinStores, StateBackend, StoreMetrics}

/**
 * One replay: the initial probe order (input indexes, most preferred first) and the spark.umjoin.*
 * settings it runs with.
 */
final case class ReplayRun(initialOrder: Seq[Int], settings: UMJoinConf)

/**
 * What one replay measured: result rows (and their checksum), time, probe work, and the routes it
 * ended with.
 */
final case class ReplayResult(rows: Long, checksum: Long, seconds: Double, probes: Long,
    matches: Long, routeChanges: Long, cycles: Long, finalOrders: Seq[Seq[Int]])

/**
 * The probe-order experiment of dpPick (paper 001, 5.1) in batch: the rows of a UMJoin's inputs
 * arrive one at a time, interleaved in a seeded random order, as from four streams. Each arriving
 * row probes the stores of the rows that arrived before it along its input's route, then joins its
 * own input's stores, so every result row is produced once, when its last row arrives. The adaptive
 * policies choose the routes again every `spark.umjoin.dpPick.cycleRows` arrivals (the paper's
 * period T, counted in rows rather than seconds so that runs are comparable), from the forecast of
 * the last `history` cycles.
 *
 * The inputs are read once and kept in memory (one partition), so every replay sees the same rows
 * in the same arrival order; each replay runs in one task with fresh stores of the configured
 * backend, timed from the first arrival to the last.
 */
final class ArrivalReplay private (exec: UMJoinExec, inputs: RDD[(Int, InternalRow)]) {

  /** The inputs' labels (tables), by input index. */
  def labels: Seq[String] = exec.inputLabels

  /** [[labels]], comma-separated (for the Python side). */
  def labelList: String = labels.mkString(",")

  /** Frees the inputs kept in memory. */
  def release(): Unit = inputs.unpersist(blocking = true)

  /**
   * Replays every run of `runs` (one task) over the arrival order drawn from `seed`.
   * `checksum`: also sum the low 32 bits of xxhash64 over each result row's columns
   * (`resultColumns` order).
   */
  def replay(seed: Long, runs: Seq[ReplayRun], checksum: Boolean): Seq[ReplayResult] = {
    val n = exec.children.size
    runs.foreach { run =>
      require(run.initialOrder.sorted == (0 until n), s"an initial order must list each of the $n" +
        s" inputs once, got ${run.initialOrder.mkString(",")}")
    }
    val graph = exec.joinGraph
    val outputs = exec.children.map(_.output)
    val result = exec.output
    inputs.mapPartitions { rows =>
      val context = TaskContext.get()
      val byInput = Array.fill(n)(mutable.ArrayBuffer[InternalRow]())
      rows.foreach { case (i, row) => byInput(i) += row }
      val arrivals = ArrivalReplay.shuffled(byInput.map(_.size).toIndexedSeq, seed)
      runs.iterator.map(run => new ReplayTask(graph, outputs, result,
        byInput.map(_.toIndexedSeq).toIndexedSeq, run, checksum, context).replay(arrivals))
    }.collect().toSeq
  }

  /**
   * The result columns in the order `checksum` hashes them, each as `<label of its input>.<name>`,
   * comma-separated.
   */
  def resultColumns: String = exec.output.map { a =>
    s"${labels(exec.children.indexWhere(_.outputSet.contains(a)))}.${a.name}"
  }.mkString(",")

  /**
   * [[replay]] for the Python side: request `{"seed", "checksum", "runs": [{"initialOrder":
   * [labels], "conf": {key: value}}]}`.
   */
  def replayJson(request: String): String = {
    val json = parse(request)
    val conf = exec.session.sessionState.conf
    val runs = (json \ "runs") match {
      case JArray(items) => items.map { item =>
        val order = (item \ "initialOrder") match {
          case JArray(names) => names.map {
            case JString(name) => labels.indexOf(name) match {
              case -1 => throw new IllegalArgumentException(s"unknown input '$name" +
                s"' in an initial order; the inputs are ${labels.mkString(", ")}")
              case i => i
            }
            case other => throw new IllegalArgumentException(
              s"an initial order lists input labels, found ${compact(render(other))}")
          }
          case _ => throw new IllegalArgumentException("each run needs an initialOrder")
        }
        val runConf = conf.clone()
        (item \ "conf") match {
          case JObject(fields) => fields.foreach {
            case (key, JString(value)) => runConf.setConfString(key, value)
            case (key, other) => throw new IllegalArgumentException(
              s"conf value of $key must be a string, found ${compact(render(other))}")
          }
          case _ =>
        }
        ReplayRun(order, UMJoinConf.from(runConf))
      }
      case _ => throw new IllegalArgumentException("the request needs a list of runs")
    }
    val seed = (json \ "seed") match { case JInt(s) => s.toLong; case _ => 0L }
    val withChecksum = (json \ "checksum") match { case JBool(b) => b; case _ => false }
    val results = replay(seed, runs, withChecksum)
    compact(render(JArray(results.map { r =>
      JObject(
        "rows" -> JLong(r.rows), "checksum" -> JLong(r.checksum), "seconds" -> JDouble(r.seconds),
        "probes" -> JLong(r.probes),
        "matches" -> JLong(r.matches), "routeChanges" -> JLong(r.routeChanges),
        "cycles" -> JLong(r.cycles),
        "finalOrders" -> JObject(r.finalOrders.zipWithIndex.map { case (order, s) =>
          labels(s) -> JArray(order.map(i => JString(labels(i))).toList)
        }.toList))
    }.toList)))
  }
}

object ArrivalReplay {

  /**
   * Prepares the replay of the UMJoin of `df` (its first, with AQE off so the plan is final): reads
   * its inputs, below any exchange, into memory.
   */
  def prepare(df: Dataset[Row]): ArrivalReplay = {
    val plan = df.queryExecution.executedPlan
    if (plan.isInstanceOf[AdaptiveSparkPlanExec]) {
      throw new IllegalArgumentException("an arrival replay needs the final plan: set " +
        "spark.sql.adaptive.enabled=false before preparing it")
    }
    val exec = plan.collectFirst { case u: UMJoinExec => u }.getOrElse(
      throw new IllegalArgumentException("the query has no UMJoin to replay: check " +
        "spark.umjoin.enabled and that it joins at least spark.umjoin.minInputs inputs"))
    val rdds = exec.children.zipWithIndex.map { case (child, i) =>
      belowExchange(child).execute().map(row => (i, row.copy()))
    }
    val inputs = rdds.head.sparkContext.union(rdds).coalesce(1).persist(StorageLevel.MEMORY_ONLY)
    inputs.count()
    new ArrivalReplay(exec, inputs)
  }

  private def belowExchange(plan: SparkPlan): SparkPlan = plan match {
    case a: InputAdapter => belowExchange(a.child) // the UMJoin is in a generated-code stage
    case e: ShuffleExchangeLike => e.child
    case e: BroadcastExchangeLike => e.child
    case other => other
  }

  /** Every row as (input << 32 | index), in a random order drawn from `seed` (Fisher-Yates). */
  def shuffled(sizes: IndexedSeq[Int], seed: Long): Array[Long] = {
    val arrivals = sizes.zipWithIndex.flatMap { case (size, i) =>
      (0 until size).map(r => (i.toLong << 32) | r)
    }.toArray
    val random = new java.util.Random(seed)
    for (k <- arrivals.length - 1 to 1 by -1) {
      val j = random.nextInt(k + 1)
      val t = arrivals(k)
      arrivals(k) = arrivals(j)
      arrivals(j) = t
    }
    arrivals
  }
}

/**
 * One replay inside the task: fresh stores, one probe core per input's route, the policy's cycles.
 */
private final class ReplayTask(
    graph: JoinGraph,
    outputs: Seq[Seq[Attribute]],
    result: Seq[Attribute],
    rows: IndexedSeq[IndexedSeq[InternalRow]],
    run: ReplayRun,
    checksum: Boolean,
    context: TaskContext) {

  private val n = outputs.size
  private val settings = run.settings.probeOrder
  private val indexesOf: IndexedSeq[Seq[StoreIndex]] =
    (0 until n).map(i =>
      graph.classes.indices.filter(c => graph.classes(c).inputs.contains(i)).map(StoreIndex.single))
  private def metric(): SQLMetric = new SQLMetric("sum")
  private val metrics =
    IndexedSeq.fill(n)(InputMetrics(metric(), metric(), metric(), metric(), metric()))
  private val storeMetrics = StoreMetrics(metric(), metric(), metric(), metric(), metric())
  private val outputRows = metric()
  private val stores: Map[(Int, StoreIndex), AppendableStore] = (0 until n).flatMap { i =>
    indexesOf(i).map(index => (i, index) -> JoinStores.appendable(run.settings.stores,
      outputs(i).size, i, context, storeMetrics))
  }.toMap
  private val addTo: IndexedSeq[InternalRow => Unit] = (0 until n).map { i =>
    JoinStores.adder(indexesOf(i).map(index => stores((i, index))),
      indexesOf(i).map(UMJoinExec.storeKeys(graph, _, i, outputs(i))), outputs(i))
  }
  private val structure =
    if (run.settings.stores.backend == StateBackend.Memory)
      StoreStructure.Hash else StoreStructure.Sorted
  private val probeGraph = ProbeSteps.graph(graph)
  private val counters = new ProbeCounters(n)

  // A route compiled once: policies often return to a route they left (code generation costs
  // milliseconds).
  private val compiled = mutable.HashMap[Route, ProbeCore]()
  private def core(route: Route): ProbeCore = compiled.getOrElseUpdate(route, new ProbeCore(
    CompiledRoute(ProbeSteps.along(graph, route, indexesOf),
      outputs, result, (input, index) => stores((input, index)),
      UMJoinExec.hashable, metrics, context.partitionId()),
    Some(metrics(route.start).rowsIn), Some(outputRows), context,
    Option.when(settings.adaptive)(counters)))

  def replay(arrivals: Array[Long]): ReplayResult = {
    val routes = Array.tabulate(n)(s => ProbeOrder.following(probeGraph, s, run.initialOrder))
    val cores = routes.map(core)
    val router = new AdaptiveRouter(settings, probeGraph, settings.costModel(structure),
      routes.map(r => r.start -> r).toMap)
    val hash = if (checksum) UnsafeProjection.create(Seq(new XxHash64(result)), result) else null
    var (produced, sum, changes, cycles) = (0L, 0L, 0L, 0L)
    val started = System.nanoTime()
    var k = 0
    while (k < arrivals.length) {
      if (settings.adaptive && k > 0 && k % settings.cycleRows == 0 && !counters.isEmpty) {
        cycles += 1
        router.record(counters,
          (0 until n).map(i => stores((i, indexesOf(i).head)).keyCount.toDouble))
        counters.reset()
        router.choose().foreach { s =>
          routes(s) = router.routes(s)
          cores(s) = core(routes(s))
          changes += 1
        }
      }
      val input = (arrivals(k) >>> 32).toInt
      val row = rows(input)((arrivals(k) & 0xffffffffL).toInt)
      val joined = cores(input).join(Iterator.single(row))
      while (joined.hasNext) {
        val out = joined.next()
        produced += 1
        if (hash != null) sum += hash(out).getLong(0) & 0xffffffffL
      }
      addTo(input)(row)
      k += 1
    }
    val seconds = (System.nanoTime() - started) / 1e9
    stores.values.foreach(_.close())
    ReplayResult(produced, sum, seconds, metrics.map(_.probes.value).sum,
      metrics.map(_.matches.value).sum, changes, cycles, routes.map(_.order).toSeq)
  }
}
