package umjoin.spark.batch

import scala.collection.mutable

import org.json4s.JsonAST._

import org.apache.spark.TaskContext
import org.apache.spark.internal.Logging
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeSet, BindReferences,
  Cast, Expression, UnsafeProjection}
import org.apache.spark.sql.catalyst.plans.LeftSemi
import org.apache.spark.sql.catalyst.plans.physical.{BroadcastDistribution, BroadcastMode,
  ClusteredDistribution, Distribution, IdentityBroadcastMode, Partitioning, PartitioningCollection,
  UnknownPartitioning, UnspecifiedDistribution}
import org.apache.spark.sql.execution.{SQLExecution, SparkPlan}
import org.apache.spark.sql.execution.joins.HashedRelationBroadcastMode
import org.apache.spark.sql.execution.metric.{SQLMetric, SQLMetrics}
import org.apache.spark.sql.types.{ByteType, IntegerType, LongType, ShortType}

import org.apache.spark.sql.execution.umjoin.BroadcastTable
import umjoin.spark.UMJoinConf
import umjoin.spark.core.{GraphShape, JoinGraph, ZippedInputsRDD}
import umjoin.spark.core.cost.{AdaptiveRouter, ProbeCounters, ProbeGraph, ProbeOrderSettings,
  StoreStructure}
import umjoin.spark.core.probe.{CompiledRoute, InputMetrics, ProbeCore, ProbeSteps, Rerouting,
  Route, StepRule, StoreIndex}
import umjoin.spark.core.store.{JoinStore, JoinStores, StateBackend, StoreMetrics}

/**
 * The batch UMJoin: one multi-way join over `children` (the inputs of a TSC group). The join is
 * its [[JoinGraph]] (kept as `graphShape` and `graphExpressions`, see [[JoinGraph.split]]): key
 * classes, residual conditions, the inputs of its LEFT SEMI and LEFT ANTI joins (filters, which let
 * a combination through or not and add no columns) and of its outer joins (probed once their ON
 * clauses can be evaluated, binding a row of NULLs where nothing matches); each input's step does
 * what its [[StepRule]] says. Every input but the streamed one (`route.start`) is kept in stores,
 * one per key class in `indexes`. A partitioned input's partition is stored per task, in stores of
 * `spark.umjoin.stateBackend` that live as long as the task. A broadcast input stored under one key
 * class is Spark's hash table on that key, built once and shared by the tasks of an executor; one
 * stored under several (an adaptive order may probe it through any) arrives as rows each task
 * indexes. Each streamed row then probes the stores along the route; with an adaptive `probeOrder`
 * the route is chosen again every cycle from the statistics of the probes so far. A fixed route
 * runs as generated code inside Spark's whole-stage code generation ([[UMJoinCodegen]]); an
 * adaptive one, or any route where code is not generated, runs in the interpreted loop
 * ([[ProbeCore]]).
 *
 * @param inputLabels   what each input reads (table names), for plans people read
 * @param broadcast     per input, whether every task gets all of it
 * @param partitionKeys per input, the key it is hash-partitioned on (one key class for all)
 */
case class UMJoinExec(
    output: Seq[Attribute],
    inputLabels: Seq[String],
    graphShape: GraphShape,
    graphExpressions: Seq[Expression],
    indexes: Seq[Seq[StoreIndex]],
    route: Route,
    probeOrder: ProbeOrderSettings,
    broadcast: Seq[Boolean],
    partitionKeys: Seq[Option[Expression]],
    children: Seq[SparkPlan]) extends SparkPlan with UMJoinCodegen with Logging {

  override def nodeName: String = "UMJoin"

  private[batch] def streamed: Int = route.start

  /** The join the node computes: its key classes and residual conditions. */
  def joinGraph: JoinGraph = graphShape.withExpressions(graphExpressions)

  /**
   * The inputs' columns as the probe loop binds them: an outer join's non-preserved side's may be
   * NULL (its padding row).
   */
  private[batch] def boundOutputs: Seq[Seq[Attribute]] = children.indices.map { i =>
    if (graphShape.outer.contains(i))
      children(i).output.map(_.withNullability(true)) else children(i).output
  }

  private[batch] lazy val initialPlan: Route.Plan = ProbeSteps.along(joinGraph, route, indexes)

  override def requiredChildDistribution: Seq[Distribution] = children.indices.map { i =>
    if (broadcast(i))
      BroadcastDistribution(UMJoinExec.broadcastMode(joinGraph, indexes(i), i, children(i).output))
    else partitionKeys(i).map(k => ClusteredDistribution(Seq(k))).getOrElse(UnspecifiedDistribution)
  }

  /**
   * Output rows keep the partitioning of the inputs that are not broadcast, where it is still
   * visible; not an outer join's padded side's: its NULL rows lie where their preserved rows do.
   */
  override def outputPartitioning: Partitioning = {
    val outputSet = AttributeSet(output)
    val local = children.indices.filterNot(i => broadcast(i) || graphShape.outer.contains(i))
      .map(children(_).outputPartitioning)
    val visible = local.filter {
      case e: Expression => e.references.subsetOf(outputSet)
      case _ => true
    }
    visible match {
      case Seq(one) => one
      case many if many.nonEmpty && many.map(_.numPartitions).distinct.size == 1 =>
        PartitioningCollection(many)
      case _ => UnknownPartitioning(local.head.numPartitions)
    }
  }

  override lazy val metrics: Map[String, SQLMetric] =
    Map("numOutputRows" -> SQLMetrics.createMetric(sparkContext, "number of output rows"),
      "routeChanges" -> SQLMetrics.createMetric(sparkContext, "probe route changes")) ++
      children.indices.flatMap { i =>
        val name = s"input #$i ${inputLabels(i)}"
        Seq(
          InputMetrics.rowsIn(i) -> SQLMetrics.createMetric(sparkContext, s"$name: rows in"),
          InputMetrics.probes(i) -> SQLMetrics.createMetric(sparkContext, s"$name: probes"),
          InputMetrics.matches(i) -> SQLMetrics.createMetric(sparkContext, s"$name: matches"),
          InputMetrics.earlyStops(i) -> SQLMetrics.createMetric(sparkContext,
            s"$name: early stops"),
          s"storeSizeInput$i" -> SQLMetrics.createSizeMetric(sparkContext, s"$name: store size"),
          s"memtableBytesInput$i" -> SQLMetrics.createSizeMetric(sparkContext,
            s"$name: RocksDB memtable bytes"),
          s"diskBytesInput$i" -> SQLMetrics.createSizeMetric(sparkContext,
            s"$name: RocksDB bytes on disk"),
          s"cacheHitsInput$i" -> SQLMetrics.createMetric(sparkContext,
            s"$name: RocksDB block cache hits"),
          s"cacheMissesInput$i" -> SQLMetrics.createMetric(sparkContext,
            s"$name: RocksDB block cache misses"),
          s"spillsInput$i" -> SQLMetrics.createMetric(sparkContext,
            s"$name: stores moved to RocksDB")) ++
          (if (graphShape.outer.contains(i)) Seq(InputMetrics.nullPadded(i) ->
            SQLMetrics.createMetric(sparkContext, s"$name: rows padded with NULLs")) else Nil) ++
          (if (semiReductions.contains(i)) Seq(s"semiReducedInput$i" -> SQLMetrics.createMetric(
            sparkContext, s"$name: rows no semi join's input matches, not stored")) else Nil)
      }

  private def inputMetrics(i: Int): InputMetrics = InputMetrics(
    metrics(InputMetrics.rowsIn(i)), metrics(InputMetrics.probes(i)),
    metrics(InputMetrics.matches(i)), metrics(InputMetrics.earlyStops(i)),
    metrics(s"storeSizeInput$i"), metrics.get(InputMetrics.nullPadded(i)))

  private def storeMetrics(i: Int): StoreMetrics = StoreMetrics(
    metrics(s"memtableBytesInput$i"), metrics(s"diskBytesInput$i"), metrics(s"cacheHitsInput$i"),
    metrics(s"cacheMissesInput$i"), metrics(s"spillsInput$i"))

  /** A broadcast input Spark hashes once per executor (on its one store index's key). */
  private def isSharedTable(i: Int): Boolean = broadcast(i) &&
    UMJoinExec.broadcastMode(joinGraph, indexes(i), i, children(i).output) != IdentityBroadcastMode

  /**
   * How a task gets its stores, one per (input, index): a broadcast hash table as the executor
   * shares it, any other input built from the rows `rowsOf(input)` gives (the task's partition, or
   * the broadcast rows). Made once on the driver, where the broadcasts run; what it captures is
   * what the tasks need for their stores and nothing of the plan.
   */
  @transient private[batch] lazy val taskStores
      : (TaskContext, Int => Iterator[InternalRow]) => Map[(Int, StoreIndex), JoinStore] = {
    val stores = UMJoinConf.from(conf).stores
    val (hashed, asRows) = children.indices.filter(broadcast).partition(isSharedTable)
    val tables = hashed.map(i => i -> BroadcastTable.of(children(i))).toMap
    val broadcastRows =
      asRows.map(i => i -> children(i).executeBroadcast[Array[InternalRow]]()).toMap
    // A shared hash table is one store, whatever the number of tasks: its size counts once.
    tables.foreach { case (i, table) => inputMetrics(i).storeSize.set(table.sizeInBytes) }
    SQLMetrics.postDriverMetricUpdates(sparkContext,
      sparkContext.getLocalProperty(SQLExecution.EXECUTION_ID_KEY),
      tables.keys.map(i => inputMetrics(i).storeSize).toSeq)
    // The semi joins' inputs are stored first: the other inputs' rows are reduced by them.
    val stored = children.indices.filter(_ != streamed).sortBy(i => !graphShape.filters.contains(i))
    val keys = stored.map(i =>
      i -> indexes(i).map(UMJoinExec.storeKeys(joinGraph, _, i, children(i).output))).toMap
    val reducing = semiReductions
    val leftOut = reducing.keys.map(i => i -> metrics(s"semiReducedInput$i")).toMap
    val (indexed, outputs) = (indexes, children.map(_.output))
    val allMetrics = children.indices.map(inputMetrics)
    val allStoreMetrics = children.indices.map(storeMetrics)
    (context, rowsOf) => {
      val built = mutable.Map[(Int, StoreIndex), JoinStore]()
      stored.foreach { i =>
        tables.get(i) match {
          case Some(table) => built((i, indexed(i).head)) = table.store()
          case None =>
            // Rows in of a broadcast input: counted once, by its broadcast exchange.
            val rows = broadcastRows.get(i).map(_.value.iterator)
              .getOrElse(UMJoinExec.countRows(rowsOf(i), allMetrics(i).rowsIn))
            val semis = reducing.getOrElse(i, Nil).map { case (semi, index, key) =>
              (built((semi, index)), UnsafeProjection.create(key))
            }
            val kept = if (semis.isEmpty) rows else rows.filter { row =>
              val matched = semis.forall { case (store, key) => store.get(key(row)).hasNext }
              if (!matched) leftOut(i) += 1
              matched
            }
            val inputStores =
              JoinStores.build(stores, kept, keys(i), outputs(i), i, context, allStoreMetrics(i))
            inputStores.foreach(store => allMetrics(i).storeSize += store.sizeInBytes)
            indexed(i).zip(inputStores).foreach { case (index, store) => built((i, index)) = store }
        }
      }
      built.toMap
    }
  }

  /**
   * Semi-join reduction as the stores are built (Yannakakis): where the group joins by inner and
   * semi joins only, a result is a combination each semi join's input holds a row for under the
   * key of the join's store index, and every input of a key class holds the same key in it. So a
   * row of another stored input (not a shared hash table) whose key for that index no row of the
   * semi join's input holds is in no result, and is not stored. Per input: (semi join's input,
   * its index, the input's key for that index). TPC-H Q18 stored all of orders (1.5 million rows
   * at SF 1) for the few its IN subquery lets through.
   */
  private lazy val semiReductions: Map[Int, Seq[(Int, StoreIndex, Seq[Expression])]] =
    if (graphShape.outer.nonEmpty) Map.empty
    else {
      val semis =
        graphShape.filters.collect { case (f, LeftSemi) if f != streamed => f }.toSeq.sorted
      children.indices.filterNot(i => i == streamed || isSharedTable(i) ||
          graphShape.filters.contains(i)).map { i =>
        i -> semis.flatMap { semi =>
          indexes(semi).find(_.classes.forall(c => joinGraph.classes(c).keyOf(i).isDefined))
            .map(index =>
              (semi, index, UMJoinExec.storeKeys(joinGraph, index, i, children(i).output)))
        }
      }.filter(_._2.nonEmpty).toMap
    }

  /**
   * The interpreted probe loop (see [[ProbeCore]]): adaptive routes, and wherever code is not
   * generated.
   */
  override protected def doExecute(): RDD[InternalRow] = {
    val local = children.indices.filterNot(broadcast)
    // Everything the tasks need, copied out of the plan so the closure does not capture it.
    val (graph, indexed, start, settings, resultAttrs, storesOf) =
      (joinGraph, indexes, route, probeOrder, output, taskStores)
    val outputs = boundOutputs
    val allMetrics = children.indices.map(inputMetrics)
    val (numOutputRows, routeChanges) = (metrics("numOutputRows"), metrics("routeChanges"))
    val structure =
      if (UMJoinConf.from(conf).stores.backend == StateBackend.Memory)
        StoreStructure.Hash else StoreStructure.Sorted

    new ZippedInputsRDD[InternalRow, InternalRow](local.map(children(_).execute()),
      { (context, iterators) =>
        val rowsOf = local.indices.map(j => local(j) -> iterators(j)).toMap
        val indexOf = storesOf(context, rowsOf)

        def compile(route: Route): CompiledRoute =
          CompiledRoute(ProbeSteps.along(graph, route, indexed),
            outputs, resultAttrs, (input, index) => indexOf((input, index)), UMJoinExec.hashable,
            allMetrics, context.partitionId())

        val rerouting = Option.when(settings.adaptive) {
          val keyCounts = (0 until graph.numInputs).map(i => indexOf.collectFirst {
            case ((`i`, _), store) => store.keyCount.toDouble
          }.getOrElse(0.0))
          new AdaptiveRouting(settings, ProbeSteps.graph(graph), start, keyCounts, structure,
            compile, routeChanges)
        }
        new ProbeCore(compile(start), Some(allMetrics(start.start).rowsIn), Some(numOutputRows),
          context, rerouting.map(_.counters), rerouting).join(rowsOf(start.start))
      })
  }

  override def simpleString(maxFields: Int): String = {
    val inputs =
      children.indices.map(i => s"#$i ${inputLabels(i)} (${placement(i)})").mkString(", ")
    val order = route.order.map(i => s"#$i${filterText(i)}").mkString(" -> ")
    val conds = if (allConditions.isEmpty) "" else s", conditions=[${conditionText(maxFields)}]"
    val adaptive = if (probeOrder.adaptive) s", adaptive=${probeOrder.policy.name}" else ""
    s"$nodeName inputs=[$inputs], joinKeys=[${joinKeyText(maxFields)}], probeOrder=[$order]" +
      s"$adaptive$conds"
  }

  override def verboseStringWithOperatorId(): String = {
    val lines = Seq(
      s"Inputs [${children.size}]: " +
        children.indices.map(i => s"#$i ${inputLabels(i)} (${placement(i)})").mkString(", "),
      "Probe order: " +
        s"${route.order.map(i => s"#$i ${inputLabels(i)}${filterText(i)}").mkString(" -> ")}" +
        (if (probeOrder.adaptive) " (initial; " +
          s"${probeOrder.policy.name} chooses again every ${probeOrder.cycleRows} rows)" else ""),
      s"Join keys: ${joinKeyText(Int.MaxValue)}") ++
      (if (allConditions.isEmpty) Nil else Seq(s"Conditions: ${conditionText(Int.MaxValue)}"))
    (s"$formattedNodeName" +: lines).mkString("\n") + "\n"
  }

  private def allConditions: Seq[Expression] =
    initialPlan.startConditions ++ initialPlan.steps.flatMap(s => s.conditions ++ s.postConditions)

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
        "placement" -> JString(
          if (i == streamed) "streamed" else if (broadcast(i)) "broadcast" else "partitioned"),
        "joinType" -> JString(joinGraph.stepRule(i).joinType.toString),
        "partitionKey" -> partitionKeys(i).map(k => JString(k.toString)).getOrElse(JNull),
        "storeKeys" -> JArray(step.toList.flatMap(s =>
          s.index.classes.map(c => JString(joinGraph.classes(c).keyOf(i).get.toString)))),
        "probeKeys" -> JArray(step.toList.flatMap(s => s.probeKeys.map(k => JString(k.toString)))),
        "conditions" -> JArray((
          if (i == streamed) initialPlan.startConditions
          else step.toSeq.flatMap(s => s.conditions ++ s.postConditions))
            .map(e => JString(e.toString)).toList))
    }.toList))

  /**
   * How an input's step treats combinations, where it is not an inner join: ` (semi)`, ` (anti)` or
   * ` (outer)`.
   */
  private def filterText(i: Int): String = joinGraph.stepRule(i).label

  private def placement(i: Int): String =
    if (i == streamed) "streamed" + partitionKeys(i).map(k => s", partitioned by $k").getOrElse("")
    else if (broadcast(i)) "broadcast"
    else s"partitioned by ${partitionKeys(i).get}"

  private def joinKeyText(maxFields: Int): String =
    initialPlan.steps.map { s =>
      s"#${s.input}: " + s.index.classes.zip(s.probeKeys).map { case (c, probe) =>
        s"${joinGraph.classes(c).keyOf(s.input).get} = $probe"
      }.mkString(", ")
    }.take(maxFields).mkString("; ")

  private def conditionText(maxFields: Int): String =
    ((if (initialPlan.startConditions.isEmpty) Nil else Seq(s"#$streamed" +
      s": ${initialPlan.startConditions.mkString(" AND ")}")) ++
      initialPlan.steps.flatMap { s =>
        // An outer input's ON clause decides what matches; its other conditions drop combinations
        // after that.
        val on = if (s.rule == StepRule.Outer) " ON" else ""
        (if (s.conditions.isEmpty) Nil else Seq(
          s"#${s.input}$on: ${s.conditions.mkString(" AND ")}")) ++
          (if (s.postConditions.isEmpty) Nil else Seq(
            s"#${s.input}: ${s.postConditions.mkString(" AND ")}"))
      }).take(maxFields).mkString("; ")

  override protected def withNewChildrenInternal(newChildren: IndexedSeq[SparkPlan]): UMJoinExec =
    copy(children = newChildren)
}

object UMJoinExec {
  private def countRows(rows: Iterator[InternalRow], counter: SQLMetric): Iterator[InternalRow] =
    rows.map { r => counter += 1; r }

  /** Input `input`'s store key for `index`, bound to the input's output. */
  def storeKeys(graph: JoinGraph, index: StoreIndex, input: Int,
      inputOutput: Seq[Attribute]): Seq[Expression] =
    hashable(index.classes.map(c =>
      BindReferences.bindReference(graph.classes(c).keyOf(input).get, inputOutput)))

  /**
   * How a broadcast input with the store indexes `indexes` travels: with one, as Spark's hash table
   * on its key (built once, as for Spark's broadcast hash join, and reusable by both); with
   * several, as rows, which each task indexes.
   */
  def broadcastMode(graph: JoinGraph, indexes: Seq[StoreIndex], input: Int,
      inputOutput: Seq[Attribute]): BroadcastMode = indexes match {
    case Seq(index) => HashedRelationBroadcastMode(storeKeys(graph, index, input, inputOutput))
    case _ => IdentityBroadcastMode
  }

  /** A single integral key is hashed as a long, so Spark's dense long-keyed hash map serves it. */
  def hashable(keys: Seq[Expression]): Seq[Expression] = keys match {
    case Seq(key) if Seq(IntegerType, ShortType, ByteType).contains(key.dataType) =>
      Seq(Cast(key, LongType))
    case _ => keys
  }
}

/**
 * An adaptive probe order in a batch task: every `cycleRows` streamed rows the counters of the
 * probes end a cycle of the task's [[AdaptiveRouter]], which chooses the route again; a different
 * route is compiled and used from the next streamed row.
 */
final class AdaptiveRouting(
    settings: ProbeOrderSettings,
    graph: ProbeGraph,
    initial: Route,
    keyCounts: IndexedSeq[Double],
    structure: StoreStructure,
    compile: Route => CompiledRoute,
    changes: SQLMetric) extends Rerouting {

  val counters: ProbeCounters = new ProbeCounters(graph.inputs)
  private val router = new AdaptiveRouter(settings, graph, settings.costModel(structure),
    Map(initial.start -> initial))
  // A route compiled once: policies often return to a route they left (code generation costs
  // milliseconds).
  private val compiled = scala.collection.mutable.HashMap[Route, CompiledRoute]()
  override def cycleRows: Long = settings.cycleRows

  override def next(): Option[CompiledRoute] = {
    router.record(counters, keyCounts)
    counters.reset()
    if (router.choose().isEmpty) None
    else {
      changes += 1
      Some(compiled.getOrElseUpdate(router.routes(initial.start),
        compile(router.routes(initial.start))))
    }
  }
}
