package umjoin.spark.batch

import org.json4s.JsonAST._

import org.apache.spark.TaskContext
import org.apache.spark.internal.Logging
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{And, Attribute, AttributeSet, BindReferences, BoundReference, Cast, Expression}
import org.apache.spark.sql.catalyst.expressions.codegen.{CodegenContext, ExprCode, GenerateUnsafeProjection}
import org.apache.spark.sql.catalyst.plans.{JoinType, LeftAnti, LeftOuter, LeftSemi}
import org.apache.spark.sql.catalyst.plans.physical.{BroadcastDistribution, BroadcastMode, ClusteredDistribution, Distribution, IdentityBroadcastMode, Partitioning, PartitioningCollection, UnknownPartitioning, UnspecifiedDistribution}
import org.apache.spark.sql.execution.{CodegenSupport, SQLExecution, SparkPlan}
import org.apache.spark.sql.execution.joins.HashedRelationBroadcastMode
import org.apache.spark.sql.execution.metric.{SQLMetric, SQLMetrics}
import org.apache.spark.sql.types.{ByteType, IntegerType, LongType, ShortType}

import org.apache.spark.sql.execution.umjoin.BroadcastTable
import umjoin.spark.UMJoinConf
import umjoin.spark.core.{JoinGraph, ZippedInputsRDD}
import umjoin.spark.core.cost.{ProbeCounters, ProbeGraph, ProbeOrderSettings, ProbeRoute, StatisticsHistory, StoreStructure}
import umjoin.spark.core.probe.{CompiledRoute, InputMetrics, ProbeCore, ProbeSteps, Rerouting, RoutePlan, StoreIndex}
import umjoin.spark.core.store.{JoinStore, JoinStores, StateBackend, StoreMetrics}

/**
 * The batch UMJoin: one multi-way join over `children` (the inputs of a TSC group). The join
 * is its key classes (`classInputs(c)` take part in class c with `classKeys(c)`) and residual
 * conditions; `filters` are the inputs of its LEFT SEMI and LEFT ANTI joins, probed last, which
 * let a combination through or not and add no columns; `outerJoins` the non-preserved inputs of its
 * outer joins with their ON clauses' key classes (`residualOuter`: which residuals are whose ON
 * clause), probed once their ON clauses can be evaluated, binding a row of NULLs where nothing matches. Every input but the streamed one (`route.start`) is kept in stores, one per key class
 * in `indexes`. A partitioned input's partition is stored per task, in stores of
 * `spark.umjoin.stateBackend` that live as long as the task. A broadcast input stored under one key
 * class is Spark's hash table on that key, built once and shared by the tasks of an executor; one
 * stored under several (an adaptive order may probe it through any) arrives as rows each task
 * indexes. Each streamed row then probes the stores along the route; with an adaptive `probeOrder`
 * the route is chosen again every cycle from the statistics of the probes so far. A fixed route runs
 * as generated code inside Spark's whole-stage code generation (`doConsume`); an adaptive one, or
 * any route where code is not generated, runs in the interpreted loop ([[ProbeCore]]).
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
    filters: Map[Int, JoinType],
    outerJoins: Map[Int, Seq[Int]],
    residualOuter: Seq[Option[Int]],
    indexes: Seq[Seq[StoreIndex]],
    route: ProbeRoute,
    probeOrder: ProbeOrderSettings,
    broadcast: Seq[Boolean],
    partitionKeys: Seq[Option[Expression]],
    children: Seq[SparkPlan]) extends SparkPlan with CodegenSupport with Logging {

  override def nodeName: String = "UMJoin"

  private def streamed: Int = route.start

  /** The join the node computes: its key classes and residual conditions. */
  def joinGraph: JoinGraph = JoinGraph.fromFields(children.size, classInputs, classKeys, residuals, residualInputs, filters, outerJoins, residualOuter)

  /** The inputs' columns as the probe loop binds them: an outer join's non-preserved side's may be NULL (its padding row). */
  private def boundOutputs: Seq[Seq[Attribute]] = children.indices.map { i =>
    if (outerJoins.contains(i)) children(i).output.map(_.withNullability(true)) else children(i).output
  }

  private lazy val initialPlan: RoutePlan = ProbeSteps.along(joinGraph, route, indexes)

  override def requiredChildDistribution: Seq[Distribution] = children.indices.map { i =>
    if (broadcast(i)) BroadcastDistribution(UMJoinExec.broadcastMode(joinGraph, indexes(i), i, children(i).output))
    else partitionKeys(i).map(k => ClusteredDistribution(Seq(k))).getOrElse(UnspecifiedDistribution)
  }

  /**
   * Output rows keep the partitioning of the inputs that are not broadcast, where it is still
   * visible; not an outer join's padded side's: its NULL rows lie where their preserved rows do.
   */
  override def outputPartitioning: Partitioning = {
    val outputSet = AttributeSet(output)
    val local = children.indices.filterNot(i => broadcast(i) || outerJoins.contains(i)).map(children(_).outputPartitioning)
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
          s"in${i}Spills" -> SQLMetrics.createMetric(sparkContext, s"$name: stores moved to RocksDB")) ++
          (if (outerJoins.contains(i)) Seq(s"in${i}NullPadded" -> SQLMetrics.createMetric(sparkContext, s"$name: rows padded with NULLs")) else Nil)
      }

  private def inputMetrics(i: Int): InputMetrics = InputMetrics(
    metrics(s"in${i}RowsIn"), metrics(s"in${i}Probes"), metrics(s"in${i}Matches"),
    metrics(s"in${i}EarlyStops"), metrics(s"in${i}StoreSize"), metrics.get(s"in${i}NullPadded"))

  private def storeMetrics(i: Int): StoreMetrics = StoreMetrics(
    metrics(s"in${i}MemtableBytes"), metrics(s"in${i}DiskBytes"), metrics(s"in${i}CacheHits"),
    metrics(s"in${i}CacheMisses"), metrics(s"in${i}Spills"))

  /**
   * How a task gets its stores, one per (input, index): a broadcast hash table as the executor
   * shares it, any other input built from the rows `rowsOf(input)` gives (the task's partition, or
   * the broadcast rows). Made once on the driver, where the broadcasts run; what it captures is what
   * the tasks need for their stores and nothing of the plan.
   */
  @transient private lazy val taskStores: (TaskContext, Int => Iterator[InternalRow]) => Map[(Int, StoreIndex), JoinStore] = {
    val stores = UMJoinConf.from(conf).stores
    val (hashed, asRows) = children.indices.filter(broadcast)
      .partition(i => UMJoinExec.broadcastMode(joinGraph, indexes(i), i, children(i).output) != IdentityBroadcastMode)
    val tables = hashed.map(i => i -> BroadcastTable.of(children(i))).toMap
    val broadcastRows = asRows.map(i => i -> children(i).executeBroadcast[Array[InternalRow]]()).toMap
    // A shared hash table is one store, whatever the number of tasks: its size counts once.
    tables.foreach { case (i, table) => inputMetrics(i).storeSize.set(table.sizeInBytes) }
    SQLMetrics.postDriverMetricUpdates(sparkContext, sparkContext.getLocalProperty(SQLExecution.EXECUTION_ID_KEY),
      tables.keys.map(i => inputMetrics(i).storeSize).toSeq)
    val stored = children.indices.filter(_ != streamed)
    val keys = stored.map(i => i -> indexes(i).map(UMJoinExec.storeKeys(joinGraph, _, i, children(i).output))).toMap
    val (indexed, outputs) = (indexes, children.map(_.output))
    val allMetrics = children.indices.map(inputMetrics)
    val allStoreMetrics = children.indices.map(storeMetrics)
    (context, rowsOf) => stored.flatMap { i =>
      tables.get(i) match {
        case Some(table) => Seq((i, indexed(i).head) -> table.store())
        case None =>
          // Rows in of a broadcast input: counted once, by its broadcast exchange.
          val rows = broadcastRows.get(i).map(_.value.iterator).getOrElse(UMJoinExec.countRows(rowsOf(i), allMetrics(i).rowsIn))
          val built = JoinStores.build(stores, rows, keys(i), outputs(i), i, context, allStoreMetrics(i))
          built.foreach(store => allMetrics(i).storeSize += store.sizeInBytes)
          indexed(i).zip(built).map { case (index, store) => (i, index) -> store }
      }
    }.toMap
  }

  /** The interpreted probe loop (see [[ProbeCore]]): adaptive routes, and wherever code is not generated. */
  override protected def doExecute(): RDD[InternalRow] = {
    val local = children.indices.filterNot(broadcast)
    // Everything the tasks need, copied out of the plan so the closure does not capture it.
    val (graph, indexed, start, settings, resultAttrs, storesOf) = (joinGraph, indexes, route, probeOrder, output, taskStores)
    val outputs = boundOutputs
    val allMetrics = children.indices.map(inputMetrics)
    val (numOutputRows, routeChanges) = (metrics("numOutputRows"), metrics("routeChanges"))
    val structure = if (UMJoinConf.from(conf).stores.backend == StateBackend.Memory) StoreStructure.Hash else StoreStructure.Sorted

    new ZippedInputsRDD[InternalRow, InternalRow](local.map(children(_).execute()), { (context, iterators) =>
      val rowsOf = local.indices.map(j => local(j) -> iterators(j)).toMap
      val indexOf = storesOf(context, rowsOf)

      def compile(route: ProbeRoute): CompiledRoute = CompiledRoute(ProbeSteps.along(graph, route, indexed),
        outputs, resultAttrs, (input, index) => indexOf((input, index)), UMJoinExec.hashable, allMetrics, context.partitionId())

      val rerouting = Option.when(settings.adaptive) {
        val keyCounts = (0 until graph.numInputs).map(i => indexOf.collectFirst { case ((`i`, _), store) => store.keyCount.toDouble }.getOrElse(0.0))
        new AdaptiveRouting(settings, ProbeSteps.graph(graph), start, keyCounts, structure, compile, routeChanges)
      }
      new ProbeCore(compile(start), Some(allMetrics(start.start).rowsIn), Some(numOutputRows), context, rerouting.map(_.counters), rerouting).join(rowsOf(start.start))
    })
  }

  // Generated code: the streamed input's rows flow from its own generated code through one loop
  // nest, a loop per step of the fixed route; an adaptive route changes at runtime, so it runs
  // interpreted. Spark's fallback (codegen off, or code that fails to compile) runs `doExecute`.
  override def supportCodegen: Boolean = !probeOrder.adaptive

  // A streamed row may give several output rows before the parent's buffer is read.
  override def needCopyResult: Boolean = true

  // doConsume evaluates each streamed column where a key, a condition or the output first reads it:
  // with Spark's default (every referenced column) all of them would be read for every streamed
  // row, also for rows the first probe drops (TPC-H Q8: decimals of 6 million lineitem rows, 17 %
  // of the query's samples).
  override def usedInputs: AttributeSet = AttributeSet.empty

  /**
   * The streamed side's input RDDs, the first one zipped with the stored inputs' partitions: a
   * task builds its stores from them before the generated code starts, and finds them in
   * `inputs[0]`, a [[StoredInputs]] (whose rows are that RDD's, untouched: possibly columnar
   * batches, hence the casts).
   */
  override def inputRDDs(): Seq[RDD[InternalRow]] = {
    val streamedRDDs = children(streamed).asInstanceOf[CodegenSupport].inputRDDs()
    val partitioned = children.indices.filter(i => i != streamed && !broadcast(i))
    val (storesOf, probed, planId) = (taskStores, initialPlan.steps.map(s => (s.input, s.index)), id)
    // An empty store filters nothing at an anti join, and pads every combination at an outer join.
    val emptyEndsAll = initialPlan.steps.map(s => s.joinType != LeftAnti && s.joinType != LeftOuter).toArray
    val zipped = new ZippedInputsRDD[Any, Any]((streamedRDDs.head +: partitioned.map(children(_).execute())).map(_.asInstanceOf[RDD[Any]]), {
      (context, iterators) =>
        val indexOf = storesOf(context, i => iterators(1 + partitioned.indexOf(i)).asInstanceOf[Iterator[InternalRow]])
        new StoredInputs(planId, probed.map(indexOf).toArray, emptyEndsAll, iterators(0))
    })
    zipped.asInstanceOf[RDD[InternalRow]] +: streamedRDDs.tail
  }

  // The generated code's fields holding the task's stores (per route step) and whether each has
  // unique keys: named by doProduce, used by doConsume.
  @transient private var storeFields: IndexedSeq[String] = IndexedSeq.empty
  @transient private var uniqueFields: IndexedSeq[String] = IndexedSeq.empty

  override def doProduce(ctx: CodegenContext): String = {
    val steps = initialPlan.steps
    storeFields = steps.map(s => ctx.addMutableState(classOf[JoinStore].getName, s"store${s.input}", forceInline = true)).toIndexedSeq
    uniqueFields = steps.map(s => ctx.addMutableState("boolean", s"unique${s.input}", forceInline = true)).toIndexedSeq
    val (ready, anyEmpty) = (ctx.addMutableState("boolean", "storesReady", forceInline = true),
      ctx.addMutableState("boolean", "anyStoreEmpty", forceInline = true))
    val stored = ctx.freshName("stored")
    val name = classOf[StoredInputs].getName
    // The plan id as a reference, not a literal: generated source that is the same for every
    // planning of a query is compiled once and then found in Spark's code cache.
    val planId = ctx.addReferenceObj("umjoinPlanId", Integer.valueOf(id), "java.lang.Integer")
    // Read when this UMJoin's rows start, not when the task starts: under a generated Union,
    // `inputs[0]` is another child's input in the partitions of that child.
    val bind = steps.indices.map(k => s"${storeFields(k)} = $stored.step($k);\n${uniqueFields(k)} = ${storeFields(k)}.keysAreUnique();")
    // A store without rows: no combination can complete, so the streamed rows are not even read.
    s"""
       |if (!$ready) {
       |  $name $stored = (($name) inputs[0]).of($planId.intValue());
       |  $anyEmpty = $stored.anyEmpty();
       |  ${bind.mkString("\n")}
       |  $ready = true;
       |}
       |if (!$anyEmpty) {
       |  ${children(streamed).asInstanceOf[CodegenSupport].produce(ctx, this)}
       |}
     """.stripMargin
  }

  override def doConsume(ctx: CodegenContext, input: Seq[ExprCode], row: ExprCode): String = {
    val plan = initialPlan
    val (storeTerms, uniqueTerms) = (storeFields, uniqueFields)

    /** Code checking `conditions` on the rows bound (attributes `attrs`, variables `vars`); runs `body` if they hold. */
    def where(conditions: Seq[Expression], attrs: Seq[Attribute], vars: Seq[ExprCode], body: => String): String =
      conditions.reduceOption(And) match {
        case None => body
        case Some(condition) =>
          val evaluated = evaluateRequiredVariables(attrs, vars, condition.references)
          ctx.currentVars = vars
          ctx.INPUT_ROW = null
          val ev = BindReferences.bindReference(condition, attrs).genCode(ctx)
          s"""
             |$evaluated
             |${ev.code}
             |if (!${ev.isNull} && ${ev.value}) {
             |  $body
             |}
           """.stripMargin
      }

    /** Code for steps k.. of the route, the route's first k + 1 inputs being bound (`attrs`, `vars`). */
    def steps(k: Int, attrs: Seq[Attribute], vars: Seq[ExprCode]): String =
      if (k == plan.steps.size) {
        val outputVars = output.map(a => vars(attrs.indexWhere(_.exprId == a.exprId)))
        s"""
           |${metricTerm(ctx, "numOutputRows")}.add(1);
           |${consume(ctx, outputVars)}
         """.stripMargin
      } else {
        val step = plan.steps(k)
        val m = s"in${step.input}"
        val probeKeys = UMJoinExec.hashable(step.probeKeys)
        // A filter's steps go on after its loop: the bound rows' columns its conditions read are evaluated before it.
        val used = probeKeys.flatMap(_.references) ++ (if (step.binds) Nil else step.conditions.flatMap(_.references))
        val keyInputs = evaluateRequiredVariables(attrs, vars, AttributeSet(used))
        ctx.currentVars = vars
        ctx.INPUT_ROW = null
        val key = GenerateUnsafeProjection.createCode(ctx, BindReferences.bindReferences(probeKeys, attrs))
        val (matches, one, found, storedRow) = (ctx.freshName("matches"), ctx.freshName("one"), ctx.freshName("found"), ctx.freshName("storedRow"))
        ctx.INPUT_ROW = storedRow
        ctx.currentVars = null
        val storedAttrs = boundOutputs(step.input)
        val storedVars = storedAttrs.zipWithIndex.map { case (a, i) => BoundReference(i, a.dataType, a.nullable).genCode(ctx) }
        val (nextAttrs, nextVars) = (attrs ++ storedAttrs, vars ++ storedVars)
        // An outer step's combinations go on from two places, each matching row and the NULL row: the
        // bound rows' columns are evaluated before both, and the rest of the route is generated for each.
        val anyMatch = ctx.freshName("anyMatch")
        val (evaluatedForBoth, outerDeclarations) =
          if (step.joinType == LeftOuter) (evaluateVariables(vars), s"boolean $anyMatch = false;") else ("", "")
        def goesOn(rowVars: Seq[ExprCode]): String = s"""
             |$found++;
             |${steps(k + 1, attrs ++ storedAttrs, vars ++ rowVars)}
           """.stripMargin
        // A semi or anti step only looks for one matching row; the combination goes on with the rows bound before.
        def matched: String = step.joinType match {
          case LeftOuter => s"""
             |${metricTerm(ctx, s"${m}Matches")}.add(1);
             |$anyMatch = true;
             |${where(step.postConditions, nextAttrs, nextVars, goesOn(storedVars))}
           """.stripMargin
          case LeftSemi | LeftAnti => s"""
             |${metricTerm(ctx, s"${m}Matches")}.add(1);
             |$found++;
             |break;
           """.stripMargin
          case _ => s"""
             |${metricTerm(ctx, s"${m}Matches")}.add(1);
             |${goesOn(storedVars)}
           """.stripMargin
        }
        val earlyStop = s"${metricTerm(ctx, s"${m}EarlyStops")}.add(1);"
        val goOn = step.joinType match {
          case LeftSemi => s"if ($found > 0L) {\n${steps(k + 1, attrs, vars)}\n} else $earlyStop"
          case LeftAnti => s"if ($found == 0L) {\n${steps(k + 1, attrs, vars)}\n} else $earlyStop"
          case LeftOuter =>
            val nulls = storedAttrs.map(a => ExprCode.forNullValue(a.dataType))
            s"""
               |if (!$anyMatch) {
               |  ${metricTerm(ctx, s"${m}NullPadded")}.add(1);
               |  ${where(step.postConditions, attrs ++ storedAttrs, vars ++ nulls, goesOn(nulls))}
               |}
               |if ($found == 0L) $earlyStop
             """.stripMargin
          case _ => s"if ($found == 0L) $earlyStop"
        }
        // Rows of the store stay valid until its next lookup, so a match is used before the next is read.
        s"""
           |${metricTerm(ctx, s"${m}Probes")}.add(1);
           |$keyInputs
           |$evaluatedForBoth
           |${key.code}
           |long $found = 0L;
           |$outerDeclarations
           |if (!${key.value}.anyNull()) {
           |  scala.collection.Iterator $matches = null;
           |  InternalRow $one = null;
           |  if (${uniqueTerms(k)}) $one = ${storeTerms(k)}.getOne(${key.value});
           |  else $matches = ${storeTerms(k)}.get(${key.value});
           |  while (true) {
           |    InternalRow $storedRow;
           |    if ($matches == null) {
           |      if ($one == null) break;
           |      $storedRow = $one;
           |      $one = null;
           |    } else {
           |      if (!$matches.hasNext()) break;
           |      $storedRow = (InternalRow) $matches.next();
           |    }
           |    ${where(step.conditions, nextAttrs, nextVars, matched)}
           |  }
           |}
           |$goOn
         """.stripMargin
      }

    val streamedAttrs = children(streamed).output
    s"""
       |${metricTerm(ctx, s"in${streamed}RowsIn")}.add(1);
       |${where(plan.startConditions, streamedAttrs, input, steps(0, streamedAttrs, input))}
     """.stripMargin
  }

  override def simpleString(maxFields: Int): String = {
    val inputs = children.indices.map(i => s"#$i ${inputLabels(i)} (${placement(i)})").mkString(", ")
    val order = route.order.map(i => s"#$i${filterText(i)}").mkString(" -> ")
    val conds = if (allConditions.isEmpty) "" else s", conditions=[${conditionText(maxFields)}]"
    val adaptive = if (probeOrder.adaptive) s", adaptive=${probeOrder.policy.name}" else ""
    s"$nodeName inputs=[$inputs], joinKeys=[${joinKeyText(maxFields)}], probeOrder=[$order]$adaptive$conds"
  }

  override def verboseStringWithOperatorId(): String = {
    val lines = Seq(
      s"Inputs [${children.size}]: " + children.indices.map(i => s"#$i ${inputLabels(i)} (${placement(i)})").mkString(", "),
      s"Probe order: ${route.order.map(i => s"#$i ${inputLabels(i)}${filterText(i)}").mkString(" -> ")}" +
        (if (probeOrder.adaptive) s" (initial; ${probeOrder.policy.name} chooses again every ${probeOrder.cycleRows} rows)" else ""),
      s"Join keys: ${joinKeyText(Int.MaxValue)}") ++
      (if (allConditions.isEmpty) Nil else Seq(s"Conditions: ${conditionText(Int.MaxValue)}"))
    (s"$formattedNodeName" +: lines).mkString("\n") + "\n"
  }

  private def allConditions: Seq[Expression] = initialPlan.startConditions ++ initialPlan.steps.flatMap(s => s.conditions ++ s.postConditions)

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
        "joinType" -> JString(joinGraph.stepType(i).toString),
        "partitionKey" -> partitionKeys(i).map(k => JString(k.toString)).getOrElse(JNull),
        "storeKeys" -> JArray(step.toList.flatMap(s => s.index.classes.map(c => JString(joinGraph.classes(c).keyOf(i).get.toString)))),
        "probeKeys" -> JArray(step.toList.flatMap(s => s.probeKeys.map(k => JString(k.toString)))),
        "conditions" -> JArray((if (i == streamed) initialPlan.startConditions else step.toSeq.flatMap(s => s.conditions ++ s.postConditions))
          .map(e => JString(e.toString)).toList))
    }.toList))

  /** How an input's step treats combinations, where it is not an inner join: ` (semi)`, ` (anti)` or ` (outer)`. */
  private def filterText(i: Int): String = joinGraph.stepType(i) match {
    case LeftSemi => " (semi)"
    case LeftAnti => " (anti)"
    case LeftOuter => " (outer)"
    case _ => ""
  }

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
      initialPlan.steps.flatMap { s =>
        // An outer input's ON clause decides what matches; its other conditions drop combinations after that.
        val on = if (s.joinType == LeftOuter) " ON" else ""
        (if (s.conditions.isEmpty) Nil else Seq(s"#${s.input}$on: ${s.conditions.mkString(" AND ")}")) ++
          (if (s.postConditions.isEmpty) Nil else Seq(s"#${s.input}: ${s.postConditions.mkString(" AND ")}"))
      }).take(maxFields).mkString("; ")

  override protected def withNewChildrenInternal(newChildren: IndexedSeq[SparkPlan]): UMJoinExec =
    copy(children = newChildren)
}

object UMJoinExec {
  private def countRows(rows: Iterator[InternalRow], counter: SQLMetric): Iterator[InternalRow] =
    rows.map { r => counter += 1; r }

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

/**
 * What the generated code of a UMJoin task reads as `inputs[0]`: the streamed side's first input,
 * as it comes, with the task's stores in route order (`step(k)` is probed at step k). A UMJoin
 * streaming another one in the same generated code wraps that one's: each finds its own by plan id.
 */
final class StoredInputs(planId: Int, stores: Array[JoinStore], emptyEndsAll: Array[Boolean], rows: Iterator[Any]) extends Iterator[Any] {
  def of(id: Int): StoredInputs =
    if (id == planId) this
    else rows match {
      case inner: StoredInputs => inner.of(id)
      case _ => throw new IllegalStateException(s"no stores of UMJoin plan $id in this task")
    }
  def step(k: Int): JoinStore = stores(k)
  /** Whether a store without rows means no combination completes (any but an anti join's). */
  def anyEmpty: Boolean = stores.indices.exists(k => emptyEndsAll(k) && stores(k).isEmpty)
  override def hasNext: Boolean = rows.hasNext
  override def next(): Any = rows.next()
}
