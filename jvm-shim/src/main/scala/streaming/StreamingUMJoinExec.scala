package umjoin.spark.streaming

import org.apache.hadoop.conf.Configuration

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{And, Attribute, Expression, IsNull}
import org.apache.spark.sql.catalyst.plans.physical.{BroadcastDistribution, Distribution,
  HashPartitioning, IdentityBroadcastMode, Partitioning, PartitioningCollection,
  StatefulOpClusteredDistribution, UnknownPartitioning, UnspecifiedDistribution}
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.exchange.{BroadcastExchangeExec, ShuffleExchangeExec}
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperatorCustomMetric,
  StatefulOperatorStateInfo, StateStoreWriter}
import org.apache.spark.sql.execution.streaming.state.{OperatorInfoV1, OperatorStateMetadata,
  OperatorStateMetadataV1, StateSchemaCompatibilityChecker, StateSchemaValidationResult, StateStore,
  StateStoreColFamilySchema, StateStoreId, StateStoreMetadataV1}
import org.apache.spark.sql.types.{IntegerType, StructType}
import org.apache.spark.util.SerializableConfiguration
import org.apache.spark.sql.execution.umjoin.StateStoreLocations

import umjoin.spark.core.{GraphShape, JoinGraph, ZippedInputsRDD}
import umjoin.spark.core.cost.{ProbeOrderPolicy, ProbeOrderSettings, StaticCacheSettings,
  StoreStructure}
import umjoin.spark.core.probe.{InputMetrics, Route}

/**
 * The streaming UMJoin: one multi-way inner join over the streams (and static tables) of a TSC
 * group, keeping one store per stream and no intermediate result.
 *
 * Layout ([[StreamingLayout]], chosen by paper 002's probe-cost model): each stream's store is
 * hash-partitioned on one of its join key classes (its child's exchange), and indexed by the
 * further classes some route probes it through; a static table is broadcast, or partitioned like a
 * stream: kept in stores like a stream's, written when the query starts and when the table changed
 * ([[StaticVersions]]), and probed through an executor's cache of its hot keys ([[StaticCaches]],
 * paper 003), or, where its rows cannot be known unchanged, read again every batch. Every stream's
 * new rows probe the other stores along its route.
 *
 * A micro-batch (paper 000, 3.1.3): new rows of input i probe the stores of inputs before i with
 * this batch's rows in them, and of inputs after i with the earlier batches' rows only, so every
 * combination of rows is produced exactly once, by whichever of its rows arrived last. It runs as a
 * few stages: stage 0 starts every stream's route in the partitions of its new rows; where a route
 * reaches a store partitioned on a class the partial combination is not in, the combination is
 * shuffled to the partition of its value of that class (or to all partitions when it has none yet)
 * and the next stage goes on there. Partial combinations live only within the batch. The last stage
 * also writes the batch's new rows into the stores, evicts what can no longer join, and commits:
 * each store is written once per batch, as the batch's version.
 *
 * The join itself is its [[JoinGraph]] (`graphShape` and `graphExpressions`), as in
 * [[umjoin.spark.batch.UMJoinExec]]. Outer joins anywhere in the group (LEFT OUTER, RIGHT
 * OUTER with its sides swapped; a chain of them, each matching one stream by the preserved
 * inputs): their streams are probed last, by their ON clauses; a combination no row of one
 * matches is padded with NULLs for it in the micro-batch Spark's chain of joins puts it out
 * ([[OuterPadding]]: `paddedNow` and `paddedBefore` per outer input, over the columns of its
 * `paddingStarts` stream, whose stored rows are kept until its join padded them). And LEFT SEMI
 * joins anywhere, one above the other on one key: their streams are probed last, lowest first, and
 * a combination no stored row of one matches waits in a store of its own, partitioned as that
 * stream's store, until a later row matches it (it goes on to the next, or comes out, once) or
 * `unmatchable` (per semi join's input) says no later row can (it is dropped). With an adaptive
 * `probeOrder`, the tasks count every probe's outcome and the driver chooses the routes again
 * between micro-batches ([[StreamingRoutes]]).
 *
 * @param lateRows    per input, its rows that arrived too late (dropped, as Spark's join drops
 *                    them)
 * @param evictable   per input, its stored rows no future row can join any more
 * @param stateTtlMs  optional bound on how long any stored row is kept (spark.umjoin.stateTtl):
 *                    rows stored longer ago are not probed any more, and removed
 * @param stateCacheRows a stream's stored rows are read into memory and probed there where a task's
 *                    partition holds at most this many (spark.umjoin.stateCacheRows)
 * @param staticCache what executors keep in memory of stored static tables
 *                    (spark.umjoin.staticCache)
 * @param sliceBounds per input spread by time slice, how far its event time can be from each other
 *                    stream's in a result (see [[SliceWindow]]): a combination is sent only to the
 *                    slices that range overlaps
 * @param outputWatermarkShiftMs the group's output watermark less its input watermark in Spark's
 *                    join tree (see [[umjoin.spark.streaming.JoinWatermarks]])
 * @param inputWatermarkForEviction the input watermark Spark's simulation gives this operator,
 *                    where the streaming planner knows it (the joins' own watermarks are below it)
 */
case class StreamingUMJoinExec(
    output: Seq[Attribute],
    inputLabels: Seq[String],
    graphShape: GraphShape,
    graphExpressions: Seq[Expression],
    unmatchable: Seq[Option[Expression]],
    paddingStarts: Seq[Option[Int]],
    paddedNow: Seq[Option[Expression]],
    paddedBefore: Seq[Option[Expression]],
    plannedLayout: GroupLayout,
    probeOrder: ProbeOrderSettings,
    lateRows: Seq[Option[Expression]],
    evictable: Seq[Option[Expression]],
    stateTtlMs: Option[Long],
    stateCacheRows: Long,
    staticCache: StaticCacheSettings,
    stateInfo: Option[StatefulOperatorStateInfo],
    eventTimeWatermarkForEviction: Option[Long],
    sliceBounds: Seq[Seq[SliceWindow.Bound]],
    outputWatermarkShiftMs: Long,
    inputWatermarkForEviction: Option[Long],
    children: Seq[SparkPlan]) extends SparkPlan with StateStoreWriter {

  override def nodeName: String = "StreamingUMJoin"
  override def shortName: String = StreamingUMJoinExec.ShortName

  /**
   * The layout this micro-batch runs: the plan's, or on a new checkpoint the one the operator
   * chose when it ran (set once, by [[doExecute]], before any task starts; read by `explain()` and
   * the checkpoint's record afterwards), as an adaptive plan holds the plan it settled on.
   */
  @volatile private var chosenLayout: Option[StreamingLayout] = plannedLayout match {
    case GroupLayout.Decided(layout) => Some(layout)
    case _: GroupLayout.FromFirstMicroBatch => None
  }

  /** The layout the operator runs (see `chosenLayout`). */
  def layout: StreamingLayout = chosenLayout.getOrElse(throw new IllegalStateException(
    "A new checkpoint's StreamingUMJoin layout is chosen when its first micro-batch runs"))

  /**
   * Every store of a partition. A new checkpoint's layout is chosen after Spark asks (when it
   * prepares the first micro-batch), so the further indexes' stores of the separate layout are not
   * known then: only the stores every layout keeps (the operator then writes Spark's metadata of it
   * again with all of them).
   */
  override val stateStoreNames: Seq[String] = storeNames(chosenLayout)

  /** Every store of a partition (with `layout` unknown, the ones every layout keeps). */
  private def storeNames(layout: Option[StreamingLayout]): Seq[String] = {
    val stored = StreamingLayout.storedOf(plannedLayout.kinds)
    (plannedLayout.stores match {
      case StoreLayout.Separate => stored.flatMap { j =>
        InputState.storeName(j) +: layout.fold(Seq.empty[String])(chosen =>
          chosen.indexes(j).indices.map(InputState.indexStoreName(InputState.storeName(j), _)))
      }
      case StoreLayout.ColumnFamilies =>
        if (stored.isEmpty) Nil else Seq(InputState.PartitionStoreName)
    }) ++ semiInputs.map(InputState.unmatchedStoreName)
  }

  /** The non-preserved streams of the group's semi joins, lowest join first (the inputs' order). */
  private def semiInputs: Seq[Int] = graphShape.filters.keys.toSeq.sorted

  private def joinGraph: JoinGraph =
    graphShape.withExpressions(graphExpressions)

  /**
   * Input j's expression for the class it is partitioned on (None: broadcast): the key of its
   * store.
   */
  private def partitionKey(j: Int): Option[Expression] =
    layout.partitionClass(j).map(c => joinGraph.classes(c).keyOf(j).get)

  /**
   * Each input placed in the state's partitions by the key its store is partitioned on, or
   * broadcast. A new checkpoint's partitioned inputs are placed by the operator, once it chose
   * their keys ([[placedChildren]]).
   */
  override def requiredChildDistribution: Seq[Distribution] = children.indices.map { j =>
    plannedLayout match {
      case _ if plannedLayout.broadcast(j) => BroadcastDistribution(IdentityBroadcastMode)
      case GroupLayout.Decided(layout) =>
        val key = StreamingUMJoinExec.placement(layout, joinGraph, j, getStateInfo.numPartitions)
        StatefulOpClusteredDistribution(key.toSeq, getStateInfo.numPartitions)
      case _: GroupLayout.FromFirstMicroBatch => UnspecifiedDistribution
    }
  }

  /**
   * The children as the micro-batch reads them: a new checkpoint's partitioned inputs each
   * hash-partitioned into the state's partitions by the layout chosen, as Spark's exchange would
   * have placed them had the layout been known when it planned.
   */
  private def placedChildren(layout: StreamingLayout): Seq[SparkPlan] = plannedLayout match {
    case _: GroupLayout.Decided => children
    case _: GroupLayout.FromFirstMicroBatch => children.indices.map { j =>
      val partitions = getStateInfo.numPartitions
      StreamingUMJoinExec.placement(layout, joinGraph, j, partitions).fold(children(j))(key =>
        ShuffleExchangeExec(HashPartitioning(Seq(key), partitions), children(j)))
    }
  }

  /**
   * Where every partitioned input is on one key class (and none is spread by time slice), each
   * route runs in the partition its start row was placed in, so each result comes out in the
   * partition of its value of that class: hash-partitioned by each input's key of it, as the
   * child's exchange placed the rows (an outer join's non-preserved key is NULL where padded, a
   * semi join's is not put out). Spark's joins put their rows out the same way, so an operator
   * above keyed by that key needs no exchange. Otherwise unknown: a route ending on another class
   * puts its results out in that class's partitions.
   */
  override def outputPartitioning: Partitioning = plannedLayout match {
    case GroupLayout.Decided(layout) => outputPartitioningOf(layout)
    case _: GroupLayout.FromFirstMicroBatch => UnknownPartitioning(getStateInfo.numPartitions)
  }

  private def outputPartitioningOf(layout: StreamingLayout): Partitioning = {
    val graph = joinGraph
    val partitions = getStateInfo.numPartitions
    val partitioned = children.indices.filter(layout.partitionClass(_).isDefined)
    val keys = partitioned
      .filterNot(j => graphShape.outer.contains(j) || graphShape.filters.contains(j))
      .flatMap(StreamingUMJoinExec.placement(layout, graph, _, partitions))
      .filter(_.references.subsetOf(outputSet))
    if (partitioned.flatMap(layout.partitionClass).distinct.size != 1 ||
        partitioned.exists(layout.isTimeSliced) || keys.isEmpty) {
      UnknownPartitioning(partitions)
    } else PartitioningCollection(keys.map(key => HashPartitioning(Seq(key), partitions)))
  }

  /**
   * Schemas of UMJoin's own stores are checked when they are opened. Spark's schema rule (which
   * needs one result per operator to write its metadata) checks the operator's one fixed entry: the
   * layout format of its state.
   */
  override def validateAndMaybeEvolveStateSchema(hadoopConf: Configuration, batchId: Long,
      stateSchemaVersion: Int): List[StateSchemaValidationResult] = {
    val format = new StructType().add("layoutFormat", IntegerType)
    val schema = StateStoreColFamilySchema(StateStore.DEFAULT_COL_FAMILY_NAME, 0, format, 0,
      format)
    List(StateSchemaCompatibilityChecker.validateAndMaybeEvolveStateSchema(getStateInfo,
      hadoopConf, List(schema), session.sessionState, stateSchemaVersion))
  }

  /**
   * The operator's stores as Spark's state-metadata source lists them: the layout-format entry
   * (`default`), then every store of its inputs with the key columns its prefix scans take (with
   * column families, the partition's one store, then each semi join's).
   */
  override def operatorStateMetadata(
      stateSchemaPaths: List[List[String]]): OperatorStateMetadata = {
    val info = getStateInfo
    val specs = chosenLayout.fold(unmatchedStates(joinGraph, children.map(_.output).toIndexedSeq)
      .map(_.spec))(_ => stateSpecs)
    val prefixColumns = specs.flatMap(spec => spec.rowStore +: spec.indexStores)
      .map(store => store.name -> InputState.keyEncoding(store.keySchema).numColsPrefixKey).toMap
    // (A row store's key is prefixed by its partitioning key's one column, whatever its type.)
    val rowStorePrefix =
      InputState.keyEncoding(InputStateSpec.rowKeySchema(IntegerType)).numColsPrefixKey
    val rowStores = StreamingLayout.storedOf(plannedLayout.kinds).map(InputState.storeName).toSet
    val stores = storeNames(chosenLayout).map(name => StateStoreMetadataV1(name,
      prefixColumns.getOrElse(name, if (rowStores(name)) rowStorePrefix else 0),
      info.numPartitions))
    OperatorStateMetadataV1(OperatorInfoV1(info.operatorId, shortName),
      (StateStoreMetadataV1(StateStoreId.DEFAULT_STORE_NAME, 0, info.numPartitions) +: stores)
        .toArray)
  }

  /**
   * Per input: its state (rows, index entries, bytes) and its probes; they show in the query's
   * progress too.
   */
  override def customStatefulOperatorMetrics: Seq[StatefulOperatorCustomMetric] = {
    import OperatorMetrics._
    val sliced = children.indices.exists(plannedLayout.maySlice)
    Seq(RouteChanges, CombinationsShipped, StateRowsReadIntoMemory, MemoryIndexBytes)
      .map(_.declared) ++
      (if (sliced) Seq(ShipNanos.declared) else Nil) ++
      children.indices.flatMap { i =>
        val perInput = Seq(StateRows, StateIndexEntries, StateBytes, RowsIn, Probes, Matches,
          EarlyStops, ConditionChecks, CostlyChecks) ++
          (if (plannedLayout.maySlice(i)) Seq(SlicePartitions, EarlierSliceRows, SliceCombinations,
            SliceProbeNanos)
          else Nil) ++
          (if (graphShape.outer.contains(i)) Seq(NullPadded) else Nil) ++
          (if (semiInputs.contains(i)) Seq(SemiDropped, UnmatchedRows) else Nil) ++
          (if (plannedLayout.kinds(i) == InputKind.StaticStored) {
            Seq(StaticLoads, StaticCacheHits, StaticCacheMisses, StaticCachedKeys,
              StaticCachedBytes, StaticDiskBytes)
          } else Nil)
        perInput.map(_.declared(i, inputLabels(i)))
      }
  }

  private def metric(m: OperatorMetrics.Metric): SQLMetric = longMetric(m.name)
  private def metric(m: OperatorMetrics.PerInput, i: Int): SQLMetric = longMetric(m.name(i))

  private def inputMetrics(i: Int): InputMetrics = {
    import OperatorMetrics._
    InputMetrics(metric(RowsIn, i), metric(Probes, i), metric(Matches, i), metric(EarlyStops, i),
      metric(StateBytes, i), Option.when(graphShape.outer.contains(i))(metric(NullPadded, i)),
      Some(metric(ConditionChecks, i)), Some(metric(CostlyChecks, i)))
  }

  override def produceOutputWatermark(inputWatermarkMs: Long): Option[Long] =
    Some(inputWatermarkMs + outputWatermarkShiftMs)

  /**
   * A batch with no new rows still runs when the watermark moved past what the state holds, or what
   * waits to be padded.
   */
  override def shouldRunAnotherBatch(newInputWatermark: Long): Boolean =
    (evictable.exists(_.isDefined) || paddingStarts.exists(_.isDefined)) &&
      inputWatermarkForEviction.orElse(eventTimeWatermarkForEviction)
        .exists(newInputWatermark > _)

  /**
   * A store instance's memory and provider metrics, as the operator's. Its keys are not what
   * numRowsTotal counts: the input rows kept (as Spark's join counts each buffered row once, not
   * its counts per key), and the semi joins' waiting combinations; an index's entries show per
   * input as `stateIndexEntriesInput<i>`.
   */
  private def setInstanceMetrics(store: StateStore): Unit = {
    val m = store.metrics
    longMetric("stateMemory") += m.memoryUsedBytes
    setStoreCustomMetrics(m.customMetrics)
    setStoreInstanceMetrics(m.instanceMetrics)
  }

  /** Per stored input, where a partition keeps its rows. */
  private def inputStates(graph: JoinGraph,
      outputs: IndexedSeq[Seq[Attribute]]): Map[Int, InputStateSpec] =
    layout.stored.map { j =>
      j -> InputStateSpec(j, outputs(j), layout.partitionClass(j).get, partitionKey(j).get,
        layout.indexes(j).map(ix => ix -> ix.classes.map(c => graph.classes(c).keyOf(j).get)),
        InputState.storeName(j))
    }.toMap

  /**
   * Where a partition keeps the combinations waiting for each semi join's first match, lowest join
   * first.
   */
  private def unmatchedStates(graph: JoinGraph,
      outputs: IndexedSeq[Seq[Attribute]]): Seq[UnmatchedSpec] =
    semiInputs.map { o =>
      val key = graph.classes.indexWhere(_.inputs.contains(o))
      val preserved = graph.joined.filter(_ != o)
      // A waiting combination may be padded for an outer input: its columns are read as nullable.
      val columns = preserved.flatMap(i =>
        if (graph.outer.contains(i)) outputs(i).map(_.withNullability(true)) else outputs(i))
      UnmatchedSpec(o,
        InputStateSpec(o, columns, key, graph.classes(key).members
          .collectFirst { case (i, e) if graph.joined.contains(i) => e }.get, Nil,
          InputState.unmatchedStoreName(o)),
        graph.residuals.filter(_.inputs.contains(o)).map(_.condition).reduceOption(And),
        unmatchable(o))
    }

  /**
   * Every state a partition of this operator keeps (each one's stores are `rowStore` and
   * `indexStores`).
   */
  def stateSpecs: Seq[InputStateSpec] = {
    val graph = joinGraph
    val outputs = children.map(_.output).toIndexedSeq
    inputStates(graph, outputs).toSeq.sortBy(_._1).map(_._2) ++
      unmatchedStates(graph, outputs).map(_.spec)
  }

  override protected def doExecute(): RDD[InternalRow] = {
    val info = getStateInfo
    val partitions = info.numPartitions
    val graph = joinGraph
    val outputs = children.map(_.output).toIndexedSeq
    val hadoopConf = session.sessionState.newHadoopConf()
    val checkpoint = new OperatorCheckpoint(info, hadoopConf)
    val run = StreamingRun.of(session, info.queryRunId)
    val layout = plannedLayout match {
      case GroupLayout.Decided(decided) => decided
      case basis: GroupLayout.FromFirstMicroBatch => chosenLayout.getOrElse {
        val chosen = chooseLayout(basis)
        chosenLayout = Some(chosen)
        // Spark's metadata of the operator lists the stores the layout adds (its indexes').
        if (storeNames(chosenLayout) != stateStoreNames) {
          checkpoint.rewriteOperatorMetadata(operatorStateMetadata(Nil))
        }
        chosen
      }
    }
    val placed = placedChildren(layout)
    // Recorded once per checkpoint; the run keeps the record for planning its next micro-batches.
    if (Option(run.layoutRecords.get(info.operatorId)).forall(_.isEmpty)) {
      run.layoutRecords.put(info.operatorId,
        Some(checkpoint.recordLayout(layout, graph, outputs, inputLabels)))
    }
    if (layout.timeSlices.exists(_.isDefined)) {
      run.slicings.put(info.operatorId, checkpoint.recordSlicing(info.storeVersion, layout,
        run.recordedSlicing(info.operatorId, checkpoint.recordedSlicing(info.storeVersion))))
    }
    run.ranVersions.put(info.operatorId, info.storeVersion)

    // The routes of this batch: the plan's, or chosen again from the statistics of the batches
    // before.
    val probeGraph = layout.probeGraph(graph)
    val fanOut = probeGraph.edges.map { case (from, to) =>
      val carried = !layout.isTimeSliced(to) &&
        layout.partitionClass(to).forall(c => graph.classes(c).inputs.contains(from))
      (from, to) -> (if (carried) 1.0 else partitions.toDouble)
    }.toMap
    val order = probeOrderFor(layout)
    if (order != probeOrder) {
      val message = s"the StreamingUMJoin of operator ${info.operatorId}" +
        s" keeps its recorded routes instead of choosing them by ${probeOrder.policy.name}" +
        (": its checkpoint's state was laid out for the fixed probe order; use a new checkpoint " +
          "location to probe adaptively")
      if (run.firstNote(message, unconverted = false)) logInfo(s"UMJoin: $message")
    }
    val cost = order.costModel(StoreStructure.Sorted).copy(fanOut = fanOut)
    val (allRoutes, changed) = StreamingRoutes.next(run, info.operatorId, probeGraph,
      layout.routes, order, cost, partitions)
    // A semi join's stream starts no route: its rows only let combinations through, at their first
    // match.
    val routes = allRoutes.filter { case (start, _) => !graphShape.filters.contains(start) }
    metric(OperatorMetrics.RouteChanges) += changed
    val statistics = Option.when(order.adaptive) {
      val accumulator = new ProbeCountersAccumulator(children.size)
      sparkContext.register(accumulator, s"UMJoin probe statistics, operator ${info.operatorId}")
      StreamingRoutes.collect(run, info.operatorId, accumulator)
      accumulator
    }

    // Stored static tables: loaded into their stores in this batch, or probed there.
    val staticLoads =
      layout.kinds.indices.filter(layout.kinds(_) == InputKind.StaticStored).map { j =>
        val decision = StaticVersions.decide(run, info, j, children(j), hadoopConf)
        if (decision.load) metric(OperatorMetrics.StaticLoads, j) += 1
        j -> decision
      }.toMap
    val job = MicroBatchJob(
      graph = graph,
      kinds = layout.kinds,
      outputs = outputs,
      result = output,
      routes = routes.map { case (start, route) => start -> layout.plan(graph, route) },
      states = inputStates(graph, outputs),
      keysRejectingNull = children.indices.map(graph.keysRejectingNull),
      lateRows = lateRows.toIndexedSeq,
      evictable = evictable.toIndexedSeq,
      stateTtlMs = stateTtlMs,
      nowMs = System.currentTimeMillis(),
      stateCacheRows = stateCacheRows,
      staticLoads = staticLoads,
      staticCache = staticCache,
      staticRowBytes = staticLoads.keys.map(j =>
        j -> (rowBytes(outputs(j)), probingRowBytes(j, routes.values.toSeq, outputs))).toMap,
      unmatched = unmatchedStates(graph, outputs),
      padding = Option.when(paddingStarts.exists(_.isDefined)) {
        val outer = graphShape.outer.keys.toSeq
        // A padded row's ON key is NULL; a matched one's never is (a NULL key joins nothing).
        OuterPadding(outer.map(o => o -> paddingStarts(o).get).toMap,
          outer.map(o => o -> paddedNow(o).get).toMap,
          outer.map(o => o -> paddedBefore(o).get).toMap,
          outer.map(o =>
            o -> (IsNull(graph.classes(graph.outer(o).head).keyOf(o).get): Expression)).toMap)
      },
      slices = children.indices.filter(layout.isTimeSliced)
        .map(j => j -> SliceWindow(layout.timeSlices(j).get, partitions, sliceBounds(j))).toMap,
      partitions = partitions,
      stores = layout.stores,
      info = info)
    // Rows an earlier time slicing placed are counted in every batch until none is left; the next
    // batch's planning reads the count.
    val sliceDrains: Map[Int, SliceDrain] = children.indices
      .filter(j => layout.timeSlices(j).exists(_.earlierWidthsMs.nonEmpty)).map { j =>
        val drain = SliceDrain(info.storeVersion, sparkContext.longAccumulator,
          metric(OperatorMetrics.EarlierSliceRows, j))
        run.sliceDrains.put((info.operatorId, j), drain)
        j -> drain
      }.toMap
    // What probing and shipping cost in this batch, and the event times stored after it; the next
    // batch's planning reads them (with `auto` slices, the count: SliceCount; a new slicing is cut
    // past those times).
    val sliced = children.indices.filter(layout.isTimeSliced)
    val slicedRows = sliced.map { j =>
      val accumulator = new SlicedRowsAccumulator
      sparkContext.register(accumulator,
        s"UMJoin sliced rows' event times, operator ${info.operatorId}, input $j")
      j -> accumulator
    }.toMap
    val sliceCosts = Option.when(sliced.nonEmpty) {
      val measured = SliceCostMetrics(
        sliced.map(j => j -> metric(OperatorMetrics.SliceCombinations, j)).toMap,
        sliced.map(j => j -> metric(OperatorMetrics.SliceProbeNanos, j)).toMap,
        metric(OperatorMetrics.ShipNanos))
      run.sliceCosts.put(info.operatorId,
        SliceCosts(info.storeVersion,
          sliced.map(j => j -> layout.timeSlices(j).get.slices).toMap, partitions, measured,
          sliced.map(j => j -> metric(OperatorMetrics.ConditionChecks, j)).toMap,
          metric(OperatorMetrics.CombinationsShipped), slicedRows))
      measured
    }
    val metrics = StageMetrics(
      numOutputRows = longMetric("numOutputRows"),
      inputs = children.indices.map(inputMetrics),
      shipped = metric(OperatorMetrics.CombinationsShipped),
      cachedStateRows = metric(OperatorMetrics.StateRowsReadIntoMemory),
      memoryIndexBytes = metric(OperatorMetrics.MemoryIndexBytes),
      droppedLate = longMetric("numRowsDroppedByWatermark"),
      updated = longMetric("numUpdatedStateRows"),
      removed = longMetric("numRemovedStateRows"),
      updatesTimeMs = longMetric("allUpdatesTimeMs"),
      removalsTimeMs = longMetric("allRemovalsTimeMs"),
      commitTimeMs = longMetric("commitTimeMs"),
      stateRows = children.indices.map(metric(OperatorMetrics.StateRows, _)),
      indexEntries = children.indices.map(metric(OperatorMetrics.StateIndexEntries, _)),
      slicePartitions = sliced.map(i => i -> metric(OperatorMetrics.SlicePartitions, i)).toMap,
      sliceDrains = sliceDrains,
      sliceCosts = sliceCosts,
      slicedRows = slicedRows,
      static = staticLoads.keys.map { i =>
        import OperatorMetrics._
        i -> StaticMetrics(metric(StaticCacheHits, i), metric(StaticCacheMisses, i),
          metric(StaticCachedKeys, i), metric(StaticCachedBytes, i), metric(StaticDiskBytes, i))
      }.toMap,
      unmatched = semiInputs.map { o =>
        o -> UnmatchedMetrics(metric(OperatorMetrics.SemiDropped, o),
          metric(OperatorMetrics.UnmatchedRows, o))
      }.toMap)
    val storeConfs = InputStateConf(conf)
    // Broadcast: an executor reads the Hadoop configuration (hundreds of entries) once per batch,
    // not with every task.
    val serializableConf = sparkContext.broadcast(new SerializableConfiguration(hadoopConf))
    val self = this

    // Partitioned inputs travel as their exchanges deliver them (a stored table only when it is
    // loaded); broadcast tables as rows.
    val partitioned = children.indices.filter(j => layout.partitionClass(j).isDefined &&
      staticLoads.get(j).forall(_.load))
    val position = partitioned.zipWithIndex.toMap
    val inputRdds = partitioned.map(placed(_).execute())
    val broadcasts = children.indices.map(j => Option.when(layout.partitionClass(j).isEmpty)(
      placed(j).executeBroadcast[Array[InternalRow]]()))

    def task(stage: Int, context: org.apache.spark.TaskContext,
        read: Int => Iterator[InternalRow]): StageTask =
      new StageTask(job, stage, context, j => read(position(j)), j => broadcasts(j).get.value,
        () => read(partitioned.size), metrics, storeConfs, serializableConf.value.value,
        statistics, (instances, rowsKept) => {
          instances.foreach(self.setInstanceMetrics)
          self.longMetric("numTotalStateRows") += rowsKept
          self.setOperatorMetrics(instances.size)
        })

    // Every stage's task k reads the stores of partition k: it runs where they were last loaded.
    val storesLoaded = Some(StateStoreLocations.of(session, info, storeNames(Some(layout))))
    val shuffled =
      (0 until job.stageCount - 1).foldLeft(Option.empty[RDD[InternalRow]]) { (previous, stage) =>
        val mapSide = new ZippedInputsRDD[InternalRow, (Int, InternalRow)](inputRdds ++ previous,
          (context, read) => task(stage, context, read).shipping(), storesLoaded)
        Some(ComboShuffle(mapSide, partitions, sparkContext))
      }
    new ZippedInputsRDD[InternalRow, InternalRow](inputRdds ++ shuffled,
      (context, read) => task(job.stageCount - 1, context, read).results(), storesLoaded)
  }

  /**
   * A new checkpoint's layout, chosen from this (first) micro-batch's figures: its inputs run once
   * more to be measured, in a job of their own ([[FirstBatchStatistics]]), as a range exchange
   * samples its input in a job before it shuffles.
   */
  private def chooseLayout(basis: GroupLayout.FromFirstMicroBatch): StreamingLayout = {
    val graph = joinGraph
    val measured = FirstBatchStatistics.measure(children.indices.map { i =>
      val input = children(i) match {
        case broadcast: BroadcastExchangeExec => broadcast.child
        case other => other
      }
      (input, FirstBatchStatistics.keys(graph, i))
    })
    val chosen = basis.chosen(graph, FirstBatchStatistics.sizes(measured, graph))
    logInfo(s"UMJoin: layout of operator ${getStateInfo.operatorId} chosen from " +
      s"${chosen.statistics}: predicted probe cost ${chosen.predictedCost}")
    chosen
  }

  /**
   * The probe order `layout` lets the operator follow: a layout chosen for the fixed order indexes
   * stores on several classes at once, which an adaptive policy's routes may not all reach (they
   * change the inputs bound before a store); its recorded routes then stay.
   */
  private def probeOrderFor(layout: StreamingLayout): ProbeOrderSettings =
    if (!probeOrder.adaptive || layout.routable(layout.probeGraph(joinGraph))) probeOrder
    else probeOrder.copy(policy = ProbeOrderPolicy.Fixed)

  /** A row's bytes as Spark estimates them from its schema. */
  private def rowBytes(attributes: Seq[Attribute]): Double =
    attributes.map(_.dataType.defaultSize).sum.max(1).toDouble

  /**
   * v_S of paper 003 for static input j: the bytes of the rows that probe it, averaged over the
   * routes' steps into it.
   */
  private def probingRowBytes(j: Int, routes: Seq[Route], outputs: Seq[Seq[Attribute]]): Double = {
    val sizes = routes.flatMap(route => route.order.indexOf(j) match {
      case p if p > 0 => Some(rowBytes(route.order.take(p).flatMap(outputs)))
      case _ => None
    })
    if (sizes.isEmpty) 1.0 else sizes.sum / sizes.size
  }

  /** Before a new checkpoint's first micro-batch ran: its inputs and what it will choose from. */
  override def simpleString(maxFields: Int): String = chosenLayout.fold {
    val inputs =
      children.indices.map(i => s"#$i ${inputLabels(i)} (${plannedLayout.kinds(i).name})")
    s"$nodeName inputs=[${inputs.take(maxFields).mkString(", ")}], layout=chosen from the " +
      s"first micro-batch when it runs, operator=${stateInfo.map(_.operatorId).getOrElse("?")}"
  }(describedWith(_, maxFields))

  private def describedWith(layout: StreamingLayout, maxFields: Int): String = {
    val graph = joinGraph
    val inputs = children.indices.map { i =>
      val placement = layout.kinds(i) match {
        case InputKind.StaticBroadcast => "static, broadcast"
        case kind =>
          val indexed = layout.indexes(i).map { ix =>
            val keys = ix.classes.map(c => graph.classes(c).keyOf(i).get)
            if (keys.size == 1) keys.head.toString else keys.mkString("(", ", ", ")")
          }
          val static = kind match {
            case InputKind.Stream if graphShape.outer.contains(i) =>
              s"left outer: padded with NULLs once the watermark rules out a match (by #" +
                s"${paddingStarts(i).get}'s event time), "
            case InputKind.Stream if graphShape.filters.contains(i) =>
              "left semi: unmatched combinations wait for it, "
            case InputKind.Stream => ""
            case InputKind.StaticStored => s"static, stored, cache ${staticCache.mode.name}, "
            case _ => "static, read every batch, "
          }
          val slices = layout.timeSlices(i).fold("") { t =>
            // (Event times before a later stretch's start, where rows of an earlier count may be
            // stored, are cut as they were.)
            val earlier = t.stretches.init.map(_.widthMs) ++ t.earlierWidthsMs
            s", ${t.slices} time slices per window" + earlier.distinct.filter(_ != t.widthMs)
              .map(w => s", rows placed by slices of $w ms still probed there").mkString
          }
          s"${static}partitioned by ${StreamingUMJoinExec.placement(
            layout, graph, i, getStateInfo.numPartitions).get}$slices" +
            (if (indexed.isEmpty) "" else s", indexed by ${indexed.mkString(", ")}")
      }
      s"#$i ${inputLabels(i)} ($placement)"
    }.mkString(", ")
    val routes = layout.routes.toSeq.sortBy(_._1)
      .filter { case (start, _) => !graphShape.filters.contains(start) }
      .map { case (start, route) =>
        s"#$start: " + StreamingUMJoinExec.routeText(layout.plan(graph, route), layout.isTimeSliced)
      }.take(maxFields).mkString("; ")
    val keys = graph.classes.map(_.members.map(_._2).mkString(" = ")).take(maxFields).mkString(", ")
    // An outer join's ON clause decides which of its rows match; the other conditions drop
    // combinations.
    val conditions = graph.residuals.map(r =>
      r.outer.map(o => s"ON #$o: ${r.condition}").getOrElse(r.condition.toString))
    val conditionText =
      if (conditions.isEmpty) "" else s", conditions=[${conditions.take(maxFields).mkString(", ")}]"
    s"$nodeName inputs=[$inputs], keys=[$keys]$conditionText, routes=[$routes], " +
      f"predictedProbeCost=${layout.predictedCost}%.4g, statistics=[${
        layout.statistics}], probeOrder=${probeOrderFor(layout).policy.name}, operator=${
        stateInfo.map(_.operatorId).getOrElse("?")}"
  }

  override protected def withNewChildrenInternal(
      newChildren: IndexedSeq[SparkPlan]): StreamingUMJoinExec =
    copy(children = newChildren)
}

object StreamingUMJoinExec {
  /** The operator's name in progress reports and in Spark's metadata of the state. */
  val ShortName = "umJoin"

  /**
   * What input j's rows are hash-partitioned by into `partitions` (None: broadcast): its key for
   * the class it is partitioned on, or, for a store spread by time slice, its event time's slice's
   * place on the ring.
   */
  def placement(layout: StreamingLayout, graph: JoinGraph, j: Int,
      partitions: Int): Option[Expression] =
    layout.partitionClass(j).map(c => graph.classes(c).keyOf(j).get).map {
      case TimeSlice(time) if layout.isTimeSliced(j) =>
        TimeSliceRing(time, layout.timeSlices(j).get, partitions)
      case key => key
    }

  /**
   * A route as `explain()` shows it: `->` a step in the same task, `=>` the partial combinations
   * shuffled to one partition of the next store, `=>*` sent to all its partitions, `=>~` to the
   * partitions of the time slices (of a `sliced` input's store) their time range overlaps.
   */
  def routeText(plan: Route.Plan, sliced: Int => Boolean): String =
    s"#${plan.start}" + plan.steps.map { step =>
      val arrow = step.reach match {
        case Route.Reach.Local => "->"
        case Route.Reach.ByKey(_) => "=>"
        case Route.Reach.AllPartitions if sliced(step.input) => "=>~"
        case Route.Reach.AllPartitions => "=>*"
      }
      s" $arrow #${step.input}"
    }.mkString
}
