package umjoin.spark.exec

import org.json4s.JsonAST._

import org.apache.spark.internal.Logging
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeSet, BindReferences, Cast, Expression}
import org.apache.spark.sql.catalyst.plans.physical.{BroadcastDistribution, BroadcastMode, ClusteredDistribution, Distribution, IdentityBroadcastMode, Partitioning, PartitioningCollection, UnknownPartitioning, UnspecifiedDistribution}
import org.apache.spark.sql.execution.{SQLExecution, SparkPlan}
import org.apache.spark.sql.execution.joins.HashedRelationBroadcastMode
import org.apache.spark.sql.execution.metric.{SQLMetric, SQLMetrics}
import org.apache.spark.sql.types.{ByteType, IntegerType, LongType, ShortType}

import umjoin.spark.UMJoinConf
import umjoin.spark.order.{ProbeCounters, ProbeGraph, ProbeOrderSettings, ProbeRoute, StatisticsHistory, StoreStructure}
import umjoin.spark.planning.{JoinGraph, ProbeSteps, RoutePlan, StoreIndex}
import org.apache.spark.sql.execution.umjoin.BroadcastTable
import umjoin.spark.state.{JoinStore, JoinStores, StateBackend, StoreMetrics}

/**
 * The batch UMJoin: one multi-way inner join over `children` (the inputs of a TSC group). The join
 * is its key classes (`classInputs(c)` take part in class c with `classKeys(c)`) and residual
 * conditions. Every input but the streamed one (`route.start`) is kept in stores, one per key class
 * in `indexes`. A partitioned input's partition is stored per task, in stores of
 * `spark.umjoin.stateBackend` that live as long as the task. A broadcast input stored under one key
 * class is Spark's hash table on that key, built once and shared by the tasks of an executor; one
 * stored under several (an adaptive order may probe it through any) arrives as rows each task
 * indexes. Each streamed row then probes the stores along the route (see [[ProbeCore]]); with an
 * adaptive `probeOrder` the route is chosen again every cycle from the statistics of the probes so far.
 *
 * @param inputLabels   what each input reads (table names), for plans people read
 * @param broadcast     per input, whether every task gets all of it
 * @param partitionKeys per input, the key it is hash-partitioned on (one key class for all)
 */
case class UMJoinExec(
    output: Seq[Attribute],
    inputLabels: Seq[String],
    classInputs: Seq[Seq[Int]],
    classKeys: Seq[Seq[Expression]],
    residuals: Seq[Expression],
    residualInputs: Seq[Seq[Int]],
    indexes: Seq[Seq[StoreIndex]],
    route: ProbeRoute,
    probeOrder: ProbeOrderSettings,
    broadcast: Seq[Boolean],
    partitionKeys: Seq[Option[Expression]],
    children: Seq[SparkPlan]) extends SparkPlan with Logging {

  override def nodeName: String = "UMJoin"

  private def streamed: Int = route.start

  /** The join the node computes: its key classes and residual conditions. */
  def joinGraph: JoinGraph = JoinGraph.fromFields(children.size, classInputs, classKeys, residuals, residualInputs)

  private lazy val initialPlan: RoutePlan = ProbeSteps.along(joinGraph, route, indexes)

  override def requiredChildDistribution: Seq[Distribution] = children.indices.map { i =>
    if (broadcast(i)) BroadcastDistribution(UMJoinExec.broadcastMode(joinGraph, indexes(i), i, children(i).output))
    else partitionKeys(i).map(k => ClusteredDistribution(Seq(k))).getOrElse(UnspecifiedDistribution)
  }

  /** Output rows keep the partitioning of the inputs that are not broadcast, where it is still visible. */
  override def outputPartitioning: Partitioning = {
    val outputSet = AttributeSet(output)
    val local = children.indices.filterNot(broadcast).map(children(_).outputPartitioning)
    val visible = local.filter {
      case e: Expression => e.references.subsetOf(outputSet)
      case _ => true
    }
    visible match {
      case Seq(one) => one
      case many if many.nonEmpty && many.map(_.numPartitions).distinct.size == 1 => PartitioningCollection(many)
      case _ => UnknownPartitioning(local.head.numPartitions)
    }
  }

  override lazy val metrics: Map[String, SQLMetric] =
    Map("numOutputRows" -> SQLMetrics.createMetric(sparkContext, "number of output rows"),
      "routeChanges" -> SQLMetrics.createMetric(sparkContext, "probe route changes")) ++
      children.indices.flatMap { i =>
        val name = s"input #$i ${inputLabels(i)}"
        Seq(
          s"in${i}RowsIn" -> SQLMetrics.createMetric(sparkContext, s"$name: rows in"),
          s"in${i}Probes" -> SQLMetrics.createMetric(sparkContext, s"$name: probes"),
          s"in${i}Matches" -> SQLMetrics.createMetric(sparkContext, s"$name: matches"),
          s"in${i}EarlyStops" -> SQLMetrics.createMetric(sparkContext, s"$name: early stops"),
          s"in${i}StoreSize" -> SQLMetrics.createSizeMetric(sparkContext, s"$name: store size"),
          s"in${i}MemtableBytes" -> SQLMetrics.createSizeMetric(sparkContext, s"$name: RocksDB memtable bytes"),
          s"in${i}DiskBytes" -> SQLMetrics.createSizeMetric(sparkContext, s"$name: RocksDB bytes on disk"),
          s"in${i}CacheHits" -> SQLMetrics.createMetric(sparkContext, s"$name: RocksDB block cache hits"),
          s"in${i}CacheMisses" -> SQLMetrics.createMetric(sparkContext, s"$name: RocksDB block cache misses"),
          s"in${i}Spills" -> SQLMetrics.createMetric(sparkContext, s"$name: stores moved to RocksDB"))
      }

  private def inputMetrics(i: Int): InputMetrics = InputMetrics(
    metrics(s"in${i}RowsIn"), metrics(s"in${i}Probes"), metrics(s"in${i}Matches"),
    metrics(s"in${i}EarlyStops"), metrics(s"in${i}StoreSize"))

  private def storeMetrics(i: Int): StoreMetrics = StoreMetrics(
    metrics(s"in${i}MemtableBytes"), metrics(s"in${i}DiskBytes"), metrics(s"in${i}CacheHits"),
    metrics(s"in${i}CacheMisses"), metrics(s"in${i}Spills"))

  override protected def doExecute(): RDD[InternalRow] = {
    val stores = UMJoinConf.from(conf).stores
    val (hashed, asRows) = children.indices.filter(broadcast)
      .partition(i => UMJoinExec.broadcastMode(joinGraph, indexes(i), i, children(i).output) != IdentityBroadcastMode)
    val tables = hashed.map(i => i -> BroadcastTable.of(children(i))).toMap
    val broadcastRows = asRows.map(i => i -> children(i).executeBroadcast[Array[InternalRow]]()).toMap
    // A shared hash table is one store, whatever the number of tasks: its size counts once.
    tables.foreach { case (i, table) => inputMetrics(i).storeSize.set(table.sizeInBytes) }
    SQLMetrics.postDriverMetricUpdates(sparkContext, sparkContext.getLocalProperty(SQLExecution.EXECUTION_ID_KEY),
      tables.keys.map(i => inputMetrics(i).storeSize).toSeq)
    val local = children.indices.filterNot(broadcast)
    // Everything the tasks need, copied out of the plan so the closure does not capture it.
    val (graph, indexed, start, settings, resultAttrs) = (joinGraph, indexes, route, probeOrder, output)
    val outputs = children.map(_.output)
    val allMetrics = children.indices.map(inputMetrics)
    val allStoreMetrics = children.indices.map(storeMetrics)
    val (numOutputRows, routeChanges) = (metrics("numOutputRows"), metrics("routeChanges"))
    val structure = if (stores.backend == StateBackend.Memory) StoreStructure.Hash else StoreStructure.Sorted

    new ZippedInputsRDD[InternalRow, InternalRow](local.map(children(_).execute()), { (context, iterators) =>
      val rowsOf = local.indices.map(j => local(j) -> iterators(j)).toMap
      // Per (input, key class): the store probed through that class.
      val indexOf: Map[(Int, StoreIndex), JoinStore] = indexed.indices.filter(_ != start.start).flatMap { i =>
        tables.get(i) match {
          case Some(table) => Seq((i, indexed(i).head) -> table.store())
          case None =>
            val keys = indexed(i).map(UMJoinExec.storeKeys(graph, _, i, outputs(i)))
            // Rows in of a broadcast input: counted once, by its broadcast exchange.
            val rows = broadcastRows.get(i).map(_.value.iterator).getOrElse(countRows(rowsOf(i), allMetrics(i).rowsIn))
            val built = JoinStores.build(stores, rows, keys, outputs(i), i, context, allStoreMetrics(i))
            built.foreach(store => allMetrics(i).storeSize += store.sizeInBytes)
            indexed(i).zip(built).map { case (index, store) => (i, index) -> store }
        }
      }.toMap

      def compile(route: ProbeRoute): CompiledRoute = CompiledRoute(ProbeSteps.along(graph, route, indexed),
        outputs, resultAttrs, (input, index) => indexOf((input, index)), UMJoinExec.hashable, allMetrics, context.partitionId())

      val rerouting = Option.when(settings.adaptive) {
        val keyCounts = (0 until graph.numInputs).map(i => indexOf.collectFirst { case ((`i`, _), store) => store.keyCount.toDouble }.getOrElse(0.0))
        new AdaptiveRouting(settings, ProbeSteps.graph(graph), start, keyCounts, structure, compile, routeChanges)
      }
      new ProbeCore(compile(start), Some(allMetrics(start.start).rowsIn), Some(numOutputRows), context, rerouting.map(_.counters), rerouting).join(rowsOf(start.start))
    })
  }

  private def countRows(rows: Iterator[InternalRow], counter: SQLMetric): Iterator[InternalRow] =
    rows.map { r => counter += 1; r }

  override def simpleString(maxFields: Int): String = {
    val inputs = children.indices.map(i => s"#$i ${inputLabels(i)} (${placement(i)})").mkString(", ")
    val order = route.order.map(i => s"#$i").mkString(" -> ")
    val conds = if (allConditions.isEmpty) "" else s", conditions=[${conditionText(maxFields)}]"
    val adaptive = if (probeOrder.adaptive) s", adaptive=${probeOrder.policy.name}" else ""
    s"$nodeName inputs=[$inputs], joinKeys=[${joinKeyText(maxFields)}], probeOrder=[$order]$adaptive$conds"
  }

  override def verboseStringWithOperatorId(): String = {
    val lines = Seq(
      s"Inputs [${children.size}]: " + children.indices.map(i => s"#$i ${inputLabels(i)} (${placement(i)})").mkString(", "),
      s"Probe order: ${route.order.map(i => s"#$i ${inputLabels(i)}").mkString(" -> ")}" +
        (if (probeOrder.adaptive) s" (initial; ${probeOrder.policy.name} chooses again every ${probeOrder.cycleRows} rows)" else ""),
      s"Join keys: ${joinKeyText(Int.MaxValue)}") ++
      (if (allConditions.isEmpty) Nil else Seq(s"Conditions: ${conditionText(Int.MaxValue)}"))
    (s"$formattedNodeName" +: lines).mkString("\n") + "\n"
  }

  private def allConditions: Seq[Expression] = initialPlan.startConditions ++ initialPlan.steps.flatMap(_.conditions)

  /** The node as the Python side reads it (TreeNode.toJSON cannot render these fields itself). */
  override def jsonFields: List[JField] = List(
    "class" -> JString(getClass.getName),
    "num-children" -> JInt(children.length),
    "output" -> JArray(output.map(a => JString(a.toString)).toList),
    "probeOrder" -> JArray(route.order.map(i => JInt(i)).toList),
    "probeOrderPolicy" -> JString(probeOrder.policy.name),
    "inputs" -> JArray(children.indices.map { i =>
      val step = initialPlan.steps.find(_.input == i)
      JObject(
        "label" -> JString(inputLabels(i)),
        "placement" -> JString(if (i == streamed) "streamed" else if (broadcast(i)) "broadcast" else "partitioned"),
        "partitionKey" -> partitionKeys(i).map(k => JString(k.toString)).getOrElse(JNull),
        "storeKeys" -> JArray(step.toList.flatMap(s => s.index.classes.map(c => JString(joinGraph.classes(c).keyOf(i).get.toString)))),
        "probeKeys" -> JArray(step.toList.flatMap(s => s.probeKeys.map(k => JString(k.toString)))),
        "conditions" -> JArray((if (i == streamed) initialPlan.startConditions else step.toSeq.flatMap(_.conditions)).map(e => JString(e.toString)).toList))
    }.toList))

  private def placement(i: Int): String =
    if (i == streamed) "streamed" + partitionKeys(i).map(k => s", partitioned by $k").getOrElse("")
    else if (broadcast(i)) "broadcast"
    else s"partitioned by ${partitionKeys(i).get}"

  private def joinKeyText(maxFields: Int): String =
    initialPlan.steps.map { s =>
      s"#${s.input}: " + s.index.classes.zip(s.probeKeys).map { case (c, probe) => s"${joinGraph.classes(c).keyOf(s.input).get} = $probe" }.mkString(", ")
    }.take(maxFields).mkString("; ")

  private def conditionText(maxFields: Int): String =
    ((if (initialPlan.startConditions.isEmpty) Nil else Seq(s"#$streamed: ${initialPlan.startConditions.mkString(" AND ")}")) ++
      initialPlan.steps.filter(_.conditions.nonEmpty).map(s => s"#${s.input}: ${s.conditions.mkString(" AND ")}")).take(maxFields).mkString("; ")

  override protected def withNewChildrenInternal(newChildren: IndexedSeq[SparkPlan]): UMJoinExec =
    copy(children = newChildren)
}

object UMJoinExec {
  /** Input `input`'s store key for `index`, bound to the input's output. */
  def storeKeys(graph: JoinGraph, index: StoreIndex, input: Int, inputOutput: Seq[Attribute]): Seq[Expression] =
    hashable(index.classes.map(c => BindReferences.bindReference(graph.classes(c).keyOf(input).get, inputOutput)))

  /**
   * How a broadcast input with the store indexes `indexes` travels: with one, as Spark's hash table
   * on its key (built once, as for Spark's broadcast hash join, and reusable by both); with several,
   * as rows, which each task indexes.
   */
  def broadcastMode(graph: JoinGraph, indexes: Seq[StoreIndex], input: Int, inputOutput: Seq[Attribute]): BroadcastMode = indexes match {
    case Seq(index) => HashedRelationBroadcastMode(storeKeys(graph, index, input, inputOutput))
    case _ => IdentityBroadcastMode
  }

  /** A single integral key is hashed as a long, so Spark's dense long-keyed hash map serves it. */
  def hashable(keys: Seq[Expression]): Seq[Expression] = keys match {
    case Seq(key) if Seq(IntegerType, ShortType, ByteType).contains(key.dataType) => Seq(Cast(key, LongType))
    case _ => keys
  }
}

/**
 * An adaptive probe order in a batch task: every cycle the counters of the probes become one
 * cycle of statistics, the last cycles are forecast for the next, and the policy chooses the route
 * again (paper 001, Algorithm 1); a different route is compiled and used from the next streamed row.
 */
final class AdaptiveRouting(
    settings: ProbeOrderSettings,
    graph: ProbeGraph,
    private var current: ProbeRoute,
    keyCounts: IndexedSeq[Double],
    structure: StoreStructure,
    compile: ProbeRoute => CompiledRoute,
    changes: SQLMetric) extends Rerouting with Logging {

  val counters: ProbeCounters = new ProbeCounters(graph.inputs)
  private val history = new StatisticsHistory(settings.history)
  // A route compiled once: policies often return to a route they left (code generation costs milliseconds).
  private val compiled = scala.collection.mutable.HashMap[ProbeRoute, CompiledRoute]()
  override def cycleRows: Long = settings.cycleRows

  override def next(): Option[CompiledRoute] = {
    history.add(counters.cycle(keyCounts))
    counters.reset()
    val forecast = history.forecast(settings.smoothing)
    val route = settings.policy.routes(graph, forecast, settings.costModel(structure), Seq(current.start))(current.start)
    logDebug(s"UMJoin ${settings.policy.name}: route ${route.order.mkString("->")} (was ${current.order.mkString("->")}) " +
      s"from gamma ${forecast.matchRate}, mu ${forecast.matchesPerSuccess}, kappa ${forecast.keys}")
    if (route == current) None
    else {
      current = route
      changes += 1
      Some(compiled.getOrElseUpdate(route, compile(route)))
    }
  }
}
