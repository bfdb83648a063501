package umjoin.spark.streaming

import org.apache.hadoop.conf.Configuration

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression, IsNull}
import org.apache.spark.sql.catalyst.plans.physical.{BroadcastDistribution, Distribution,
  HashPartitioning, IdentityBroadcastMode, Partitioning, PartitioningCollection,
  StatefulOpClusteredDistribution, UnknownPartitioning, UnspecifiedDistribution}
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.exchange.{BroadcastExchangeExec, ShuffleExchangeExec}
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperatorCustomMetric,
  StatefulOperatorStateInfo, StateStoreWriter}
import org.apache.spark.sql.execution.streaming.state.{OperatorInfoV1, OperatorStateMetadata,
  OperatorStateMetadataV1, PrefixKeyScanStateEncoderSpec, StateSchemaCompatibilityChecker,
  StateSchemaValidationResult, StateStore, StateStoreColFamilySchema, StateStoreConf,
  StateStoreId, StateStoreMetadataV1}
import org.apache.spark.sql.types.{IntegerType, StructType}
import org.apache.spark.util.SerializableConfiguration
import org.apache.spark.sql.execution.umjoin.StateStoreLocations

import umjoin.spark.core.{JoinGraph, ZippedInputsRDD}
import umjoin.spark.core.cost.{ProbeOrderPolicy, ProbeOrderSettings, StoreStructure}
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
 * The join itself is its [[JoinGraph]] (`spec.graphShape` and `graphExpressions`), as in
 * [[umjoin.spark.batch.UMJoinExec]]. Outer joins anywhere in the group (LEFT OUTER, RIGHT
 * OUTER with its sides swapped; a chain of them, each matching one stream by the preserved
 * inputs): their streams are probed last, by their ON clauses; a combination no row of one
 * matches is padded with NULLs for it in the micro-batch Spark's chain of joins puts it out
 * ([[OuterPadding]]: `paddedNow` and `paddedBefore` per outer input, over the columns of its
 * `spec.paddingStarts` stream, whose stored rows are kept until its join padded them). And LEFT
 * SEMI joins anywhere, one above the other on one key: their streams are probed last, lowest
 * first, and a combination no stored row of one matches waits in a store of its own, partitioned
 * as that stream's store, until a later row matches it (it goes on to the next, or comes out,
 * once) or `unmatchable` (per semi join's input) says no later row can (it is dropped). With an
 * adaptive `spec.probeOrder`, the tasks count every probe's outcome and the driver chooses the
 * routes again between micro-batches ([[StreamingRoutes]]).
 *
 * @param spec       the group as its planner describes it, less the expressions that follow
 * @param graphExpressions the join graph's expressions (see [[JoinGraph]])
 * @param lateRows    per input, its rows that arrived too late (dropped, as Spark's join drops
 *                    them)
 * @param evictable   per input, its stored rows no future row can join any more
 * @param unmatchable per semi join's input, the waiting combinations no later row of it can match
 * @param paddedNow   per outer input, when its join's state watermark rules out a later match in
 *                    this micro-batch, and `paddedBefore` in the one before (see [[OuterPadding]])
 */
case class StreamingUMJoinExec(
    output: Seq[Attribute],
    spec: GroupSpec,
    graphExpressions: Seq[Expression],
    lateRows: Seq[Option[Expression]],
    evictable: Seq[Option[Expression]],
    unmatchable: Seq[Option[Expression]],
    paddedNow: Seq[Option[Expression]],
    paddedBefore: Seq[Option[Expression]],
    stateInfo: Option[StatefulOperatorStateInfo],
    children: Seq[SparkPlan]) extends SparkPlan with StateStoreWriter {

  override def nodeName: String = "StreamingUMJoin"
  override def shortName: String = StreamingUMJoinExec.ShortName

  /**
   * The layout this micro-batch runs: the plan's, or on a new checkpoint the one the operator
   * chose when it ran (set once, by [[doExecute]], before any task starts; read by `explain()` and
   * the checkpoint's record afterwards), as an adaptive plan holds the plan it settled on.
   */
  @volatile private var chosenLayout: Option[StreamingLayout] = spec.layout match {
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
  override val stateStoreNames: Seq[String] = spec.storeNames(chosenLayout)

  private def joinGraph: JoinGraph =
    spec.graphShape.withExpressions(graphExpressions)

  /**
   * Each input placed in the state's partitions by the key its store is partitioned on, or
   * broadcast. A new checkpoint's partitioned inputs are placed by the operator, once it chose
   * their keys ([[placedChildren]]).
   */
  override def requiredChildDistribution: Seq[Distribution] = children.indices.map { j =>
    spec.layout match {
      case _ if spec.layout.broadcast(j) => BroadcastDistribution(IdentityBroadcastMode)
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
  private def placedChildren(layout: StreamingLayout): Seq[SparkPlan] = spec.layout match {
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
  override def outputPartitioning: Partitioning = spec.layout match {
    case GroupLayout.Decided(layout) => outputPartitioningOf(layout)
    case _: GroupLayout.FromFirstMicroBatch => UnknownPartitioning(getStateInfo.numPartitions)
  }

  private def outputPartitioningOf(layout: StreamingLayout): Partitioning = {
    val graph = joinGraph
    val partitions = getStateInfo.numPartitions
    val partitioned = children.indices.filter(layout.partitionClass(_).isDefined)
    val keys = partitioned
      .filterNot(j => spec.graphShape.outer.contains(j) || spec.graphShape.filters.contains(j))
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
    val specs = chosenLayout.fold(UnmatchedSpec.of(joinGraph, children.map(_.output).toIndexedSeq,
      unmatchable).map(_.spec))(_ => stateSpecs)
    val listed = spec.layout.stores.rowsListedByKey
    def prefixOf(store: StoreSchema): Int = store.keyEncoding match {
      case prefixed: PrefixKeyScanStateEncoderSpec => prefixed.numColsPrefixKey
      case _ => 0
    }
    val prefixColumns = specs.flatMap(spec => spec.rowStore(listed) +: spec.indexStores)
      .map(store => store.name -> prefixOf(store)).toMap
    // (A row store's key is prefixed by its partitioning key's one column, whatever its type,
    // unless it is that column alone.)
    val rowStorePrefix = if (listed) 0
      else InputState.keyEncoding(InputStateSpec.rowKeySchema(IntegerType)).numColsPrefixKey
    val rowStores = StreamingLayout.storedOf(spec.layout.kinds).map(InputState.storeName).toSet
    val stores = spec.storeNames(chosenLayout).map(name => StateStoreMetadataV1(name,
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
    val sliced = children.indices.exists(spec.layout.maySlice)
    Seq(RouteChanges, CombinationsShipped, StateRowsReadIntoMemory, MemoryIndexBytes)
      .map(_.declared) ++
      (if (sliced) Seq(ShipNanos.declared) else Nil) ++
      children.indices.flatMap { i =>
        val perInput = Seq(StateRows, StateIndexEntries, StateBytes, RowsIn, Probes, Matches,
          EarlyStops, ConditionChecks, CostlyChecks) ++
          (if (spec.layout.maySlice(i)) Seq(SlicePartitions, EarlierSliceRows, SliceCombinations,
            SliceProbeNanos)
          else Nil) ++
          (if (spec.graphShape.outer.contains(i)) Seq(NullPadded) else Nil) ++
          (if (spec.semiInputs.contains(i)) Seq(SemiDropped, UnmatchedRows) else Nil) ++
          (if (spec.layout.kinds(i) == InputKind.StaticStored) {
            Seq(StaticLoads, StaticCacheHits, StaticCacheMisses, StaticCachedKeys,
              StaticCachedBytes, StaticDiskBytes)
          } else Nil)
        perInput.map(_.declared(i, spec.inputLabels(i)))
      }
  }

  private def metric(m: OperatorMetrics.Metric): SQLMetric = longMetric(m.name)
  private def metric(m: OperatorMetrics.PerInput, i: Int): SQLMetric = longMetric(m.name(i))

  private def inputMetrics(i: Int): InputMetrics = {
    import OperatorMetrics._
    InputMetrics(metric(RowsIn, i), metric(Probes, i), metric(Matches, i), metric(EarlyStops, i),
      metric(StateBytes, i), Option.when(spec.graphShape.outer.contains(i))(metric(NullPadded, i)),
      Some(metric(ConditionChecks, i)), Some(metric(CostlyChecks, i)))
  }

  override def produceOutputWatermark(inputWatermarkMs: Long): Option[Long] =
    Some(inputWatermarkMs + spec.outputWatermarkShiftMs)

  /**
   * A batch with no new rows still runs when the watermark moved past what the state holds, or what
   * waits to be padded.
   */
  override def shouldRunAnotherBatch(newInputWatermark: Long): Boolean =
    (evictable.exists(_.isDefined) || spec.paddingStarts.nonEmpty) &&
      spec.inputWatermark.orElse(spec.evictionWatermark)
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

  /**
   * Every state a partition of this operator keeps (each one's stores are `rowStore` and
   * `indexStores`).
   */
  def stateSpecs: Seq[InputStateSpec] = {
    val graph = joinGraph
    val outputs = children.map(_.output).toIndexedSeq
    InputStateSpec.of(layout, graph, outputs).toSeq.sortBy(_._1).map(_._2) ++
      UnmatchedSpec.of(graph, outputs, unmatchable).map(_.spec)
  }

  override protected def doExecute(): RDD[InternalRow] = {
    val info = getStateInfo
    val partitions = info.numPartitions
    val graph = joinGraph
    val outputs = children.map(_.output).toIndexedSeq
    val hadoopConf = session.sessionState.newHadoopConf()
    val checkpoint = new OperatorCheckpoint(info, hadoopConf)
    val run = StreamingRun.of(session, info.queryRunId)
    val layout = spec.layout match {
      case GroupLayout.Decided(decided) => decided
      case basis: GroupLayout.FromFirstMicroBatch => chosenLayout.getOrElse {
        val chosen = chooseLayout(basis)
        chosenLayout = Some(chosen)
        // Spark's metadata of the operator lists the stores the layout adds (its indexes').
        if (spec.storeNames(chosenLayout) != stateStoreNames) {
          checkpoint.rewriteOperatorMetadata(operatorStateMetadata(Nil))
        }
        chosen
      }
    }
    val placed = placedChildren(layout)
    // A group of one stream and static tables keeps nothing a later micro-batch needs: where its
    // stores miss this micro-batch's version (the batch before ran without UMJoin, or read the
    // tables again), they start empty at it, and this micro-batch loads the tables.
    if (info.storeVersion > 0 && !layout.stored.exists(layout.kinds(_) == InputKind.Stream) &&
        !run.ranVersions.contains(info.operatorId) && !checkpoint.committedBefore) {
      startEmpty(layout)
    }
    spec.takeOver.foreach(takeOverSparkJoins(_, layout, graph, outputs, checkpoint, run))
    // Recorded once per checkpoint; the run keeps the record for planning its next micro-batches.
    if (Option(run.layoutRecords.get(info.operatorId)).forall(_.isEmpty)) {
      run.layoutRecords.put(info.operatorId,
        Some(checkpoint.recordLayout(layout, graph, outputs, spec.inputLabels)))
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
    if (order != spec.probeOrder) {
      val message = s"the StreamingUMJoin of operator ${info.operatorId}" +
        s" keeps its recorded routes instead of choosing them by ${spec.probeOrder.policy.name}" +
        (": its checkpoint's state was laid out for the fixed probe order; use a new checkpoint " +
          "location to probe adaptively")
      if (run.firstNote(message, unconverted = false)) logInfo(s"UMJoin: $message")
    }
    val cost = order.costModel(StoreStructure.Sorted).copy(fanOut = fanOut)
    val (allRoutes, changed) = StreamingRoutes.next(run, info.operatorId, probeGraph,
      layout.routes, order, cost, partitions)
    // A semi join's stream starts no route: its rows only let combinations through, at their first
    // match.
    val routes = allRoutes.filter { case (start, _) => !spec.graphShape.filters.contains(start) }
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
      spec = spec,
      layout = layout,
      graph = graph,
      outputs = outputs,
      result = output,
      lateRows = lateRows.toIndexedSeq,
      evictable = evictable.toIndexedSeq,
      unmatched = UnmatchedSpec.of(graph, outputs, unmatchable),
      padding = Option.when(spec.paddingStarts.nonEmpty) {
        val outer = spec.paddingStarts.keys.toSeq
        // A padded row's ON key is NULL; a matched one's never is (a NULL key joins nothing).
        OuterPadding(spec.paddingStarts, outer.map(o => o -> paddedNow(o).get).toMap,
          outer.map(o => o -> paddedBefore(o).get).toMap,
          outer.map(o =>
            o -> (IsNull(graph.classes(graph.outer(o).head).keyOf(o).get): Expression)).toMap)
      },
      routes = routes.map { case (start, route) => start -> layout.plan(graph, route) },
      staticLoads = staticLoads,
      nowMs = System.currentTimeMillis(),
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
      unmatched = spec.semiInputs.map { o =>
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
    val storesLoaded = Some(StateStoreLocations.of(session, info, spec.storeNames(Some(layout))))
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
   * Takes the state of Spark's joins over, in this micro-batch of a query that ran them before
   * (see [[SparkJoinTakeOver]]): their rows written into this operator's stores as the version
   * this micro-batch reads, the layout recorded, then Spark's metadata of the joins replaced by
   * this operator's (the take-over's last step: a restart before it runs Spark's joins again and
   * takes over again) and their state moved out of the state directory.
   */
  private def takeOverSparkJoins(takeOver: SparkJoinTakeOver, layout: StreamingLayout,
      graph: JoinGraph, outputs: IndexedSeq[Seq[Attribute]], checkpoint: OperatorCheckpoint,
      run: StreamingRun): Unit = {
    val info = getStateInfo
    val start = System.nanoTime()
    val rows = SparkJoinTakeOver.writeInto(sparkContext, takeOver, layout, graph, outputs, info,
      StateStoreConf(conf), InputStateConf(conf), session.sessionState.newHadoopConf())
    val replaced = takeOver.replaced(info.operatorId)
    run.layoutRecords.put(info.operatorId,
      Some(checkpoint.recordTakeOver(layout, graph, outputs, spec.inputLabels, replaced)))
    val away = checkpoint.finishTakeOver(replaced, operatorStateMetadata(Nil))
    logInfo(s"UMJoin: operator ${info.operatorId} took over the state of Spark's stream-stream " +
      s"joins (operators ${takeOver.operators.mkString(", ")}, join state format " +
      s"${takeOver.stateFormatVersion}) in micro-batch ${info.storeVersion}: $rows state rows " +
      s"moved into its stores in ${(System.nanoTime() - start) / 1000000} ms; the joins' state " +
      s"now is in $away")
  }

  /**
   * Writes an empty version of every partition's one store at this micro-batch's version (the
   * planner converts such a group in a later micro-batch only where the stores are RocksDB's: one
   * per partition, its families created when opened).
   */
  private def startEmpty(layout: StreamingLayout): Unit = {
    require(layout.stores.oneStorePerPartition,
      s"UMJoin: stores of layout ${layout.stores.name} cannot start at a later version")
    val info = getStateInfo
    for (partition <- 0 until info.numPartitions) {
      PartitionStores.startEmpty(info, partition, InputStateConf(conf).indexes,
        session.sessionState.newHadoopConf())
    }
    logInfo(s"UMJoin: the stores of operator ${info.operatorId} start empty at version " +
      s"${info.storeVersion}: the micro-batch before ran without them (as Spark's stream-static " +
      "join); its static tables are loaded in this one")
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
    if (!spec.probeOrder.adaptive || layout.routable(layout.probeGraph(joinGraph))) spec.probeOrder
    else spec.probeOrder.copy(policy = ProbeOrderPolicy.Fixed)

  /** Before a new checkpoint's first micro-batch ran: its inputs and what it will choose from. */
  override def simpleString(maxFields: Int): String = chosenLayout.fold {
    val inputs =
      children.indices.map(i => s"#$i ${spec.inputLabels(i)} (${spec.layout.kinds(i).name})")
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
            case InputKind.Stream if spec.graphShape.outer.contains(i) =>
              s"left outer: padded with NULLs once the watermark rules out a match (by #" +
                s"${spec.paddingStarts(i)}'s event time), "
            case InputKind.Stream if spec.graphShape.filters.contains(i) =>
              "left semi: unmatched combinations wait for it, "
            case InputKind.Stream => ""
            case InputKind.StaticStored => s"static, stored, cache ${spec.staticCache.mode.name}, "
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
      s"#$i ${spec.inputLabels(i)} ($placement)"
    }.mkString(", ")
    val routes = layout.routes.toSeq.sortBy(_._1)
      .filter { case (start, _) => !spec.graphShape.filters.contains(start) }
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
