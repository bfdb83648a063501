package umjoin.spark.streaming

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration

import org.apache.spark.{Partitioner, ShuffleDependency, SparkContext, TaskContext}
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{And, Attribute, BindReferences, BoundReference, Expression, JoinedRow, Not, Or, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter
import org.apache.spark.sql.catalyst.plans.physical.HashPartitioning
import org.apache.spark.sql.execution.{ShuffledRowRDD, UnsafeRowSerializer}
import org.apache.spark.sql.execution.exchange.ShuffleExchangeExec
import org.apache.spark.sql.execution.metric.{SQLMetric, SQLShuffleReadMetricsReporter, SQLShuffleWriteMetricsReporter}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.unsafe.Platform

import org.apache.spark.sql.execution.umjoin.{PagedStore, ShuffleWrites}
import umjoin.spark.batch.UMJoinExec
import umjoin.spark.core.{GeneratedCode, JoinGraph}
import umjoin.spark.core.cost.{ProbeCounters, StaticCacheSettings}
import umjoin.spark.core.probe.{CompiledRoute, InputMetrics, ProbeCore, Route, StoreIndex, StreamPadding}
import umjoin.spark.core.store.JoinStore

/** The metrics the tasks of a micro-batch add to (the node's SQL metrics, fetched on the driver). */
final case class StageMetrics(
    numOutputRows: SQLMetric,
    inputs: IndexedSeq[InputMetrics],
    shipped: SQLMetric,
    cachedStateRows: SQLMetric,
    memoryIndexBytes: SQLMetric,
    droppedLate: SQLMetric,
    updated: SQLMetric,
    removed: SQLMetric,
    stateRows: IndexedSeq[SQLMetric],
    indexEntries: IndexedSeq[SQLMetric],
    slicePartitions: Map[Int, SQLMetric],
    sliceDrains: Map[Int, SliceDrain],
    sliceCosts: Option[SliceCostMetrics],
    slicedRows: Map[Int, SlicedRowsAccumulator],
    static: Map[Int, StaticMetrics],
    unmatched: Map[Int, UnmatchedMetrics])

/**
 * What the tasks measure of time-sliced stores' costs (see [[SliceCosts]]): per sliced input, the
 * combinations sent to its slices and the time testing them there; the time shipping combinations.
 */
final case class SliceCostMetrics(combinations: Map[Int, SQLMetric], probeNanos: Map[Int, SQLMetric], shipNanos: SQLMetric)

/** The metrics of a semi join (by its input): combinations no row matched (dropped), and combinations waiting for a match. */
final case class UnmatchedMetrics(gone: SQLMetric, waiting: SQLMetric)

/**
 * A semi join's combinations of its preserved inputs that no row of its non-preserved input
 * `nonPreserved` matched yet: kept in `spec`'s store (rows: the preserved inputs' columns, in
 * input order), partitioned as `nonPreserved`'s store is, by the combination's value of the join's key class.
 *
 * @param onCondition the rest of the join's condition, over a combination's columns and then `nonPreserved`'s
 * @param unmatchable the combinations no later row of `nonPreserved` can match (None: no watermark yet); they are dropped
 */
final case class UnmatchedSpec(nonPreserved: Int, spec: InputStateSpec, onCondition: Option[Expression],
    unmatchable: Option[Expression])

/**
 * When the group's outer joins put out a combination of their preserved inputs padded with NULLs:
 * in the batch its formation, its matched rows' arrivals and, for every input it is padded for, the
 * first batch in which that join's state watermark ruled out a later match, whichever is latest,
 * as Spark's chain of outer joins puts it out. Conditions are over the columns of the preserved
 * inputs (`now(o)` and `before(o)`: outer input o's join rules it out in this batch, and did in the
 * one before; Spark's state watermark predicate of the join's preserved side, which reads stream
 * `starts(o)` only); `padded(o)`: a result row's columns of o are NULLs. Combinations none of whose
 * rows is new come out by the rescan of each start's stored rows: see [[StageTask]].
 */
final case class OuterPadding(starts: Map[Int, Int], now: Map[Int, Expression], before: Map[Int, Expression], padded: Map[Int, Expression]) {
  /** The streams whose stored rows are rescanned, in the order their rescans claim a combination due by several. */
  val rescanStarts: Seq[Int] = starts.values.toSeq.distinct.sorted

  private def joinsOf(start: Int): Seq[Int] = starts.keys.toSeq.sorted.filter(starts(_) == start)
  /** A stored row of `starts(o)` that o's join rules out now, not before: its combinations may be due. */
  def newly(o: Int): Expression = And(now(o), Not(before(o)))
  /** A stored row of `start` some join evicted by its event time rules out just now. */
  def rescanned(start: Int): Expression = joinsOf(start).map(newly).reduce(Or)
  private def dueBy(start: Int): Expression = joinsOf(start).map(o => And(padded(o), newly(o))).reduce(Or)
  /**
   * A complete combination the rescan of `start` puts out: padded for some input whose join ruled
   * it out just now by `start`'s time, and by none an earlier start's rescan answers for (it puts it out once).
   */
  def due(start: Int): Expression =
    rescanStarts.takeWhile(_ != start).map(dueBy).foldLeft(dueBy(start))((due, earlier) => And(due, Not(earlier)))
}

/** The metrics of a stored static table. */
final case class StaticMetrics(hits: SQLMetric, misses: SQLMetric, cachedKeys: SQLMetric, cachedBytes: SQLMetric, diskBytes: SQLMetric)

/**
 * What every task of one micro-batch of a streaming UMJoin needs (it travels with them).
 *
 * @param keysRejectingNull per input, the keys a row with a NULL in one is dropped for: it joins nothing
 *                   (not those of an outer join preserving the input, which pads such a row)
 * @param nowMs      the batch's time, the same in every task and retry (stored rows' time, TTL)
 * @param stateCacheRows a stream's stored rows are probed in memory where a task's partition holds at most this many
 * @param staticLoads per stored static table, whether this batch writes its stores, and which load they hold
 * @param staticRowBytes per stored static table, its rows' and the rows probing it estimated bytes (v_R, v_S)
 * @param slices     per stream spread by time slice, which of its partitions a combination is sent to
 */
final case class MicroBatchJob(
    graph: JoinGraph,
    kinds: IndexedSeq[InputKind],
    outputs: IndexedSeq[Seq[Attribute]],
    result: Seq[Attribute],
    routes: Map[Int, Route.Plan],
    states: Map[Int, InputStateSpec],
    keysRejectingNull: IndexedSeq[Seq[Expression]],
    lateRows: IndexedSeq[Option[Expression]],
    evictable: IndexedSeq[Option[Expression]],
    stateTtlMs: Option[Long],
    nowMs: Long,
    stateCacheRows: Long,
    staticLoads: Map[Int, StaticVersions.Decision],
    staticCache: StaticCacheSettings,
    staticRowBytes: Map[Int, (Double, Double)],
    unmatched: Seq[UnmatchedSpec],
    padding: Option[OuterPadding],
    slices: Map[Int, SliceWindow],
    partitions: Int,
    info: StatefulOperatorStateInfo) {

  /**
   * The route a shipped row's tag continues: a stream's new rows' route, or the rescan of
   * a padding start's stored rows (tag `kinds.size + start`), which takes the same steps.
   */
  def planOf(tag: Int): Route.Plan = routes(if (isRescan(tag)) tag - kinds.size else tag)
  def isRescan(tag: Int): Boolean = tag >= kinds.size

  /** The inputs whose rows a combination of the route of `tag` holds once its first `n` inputs are probed (a semi join's binds none). */
  def boundBy(tag: Int, n: Int): Seq[Int] = {
    val run = planOf(tag)
    run.route.order.take(n).filter(i => run.steps.forall(step => step.input != i || step.rule.binds))
  }

  /** Stages the routes need: one per segment of the longest. */
  private def routeStages: Int = routes.values.map(_.segments.size).max

  /**
   * Per semi join (`unmatched`'s order), the stage that settles its waiting combinations: the routes'
   * last, and one more after each change of key (a combination one semi join lets through goes on to
   * the next one's partition: that join's stores are partitioned by its key).
   */
  val settleStage: IndexedSeq[Int] = unmatched.indices.scanLeft(routeStages - 1) { (stage, k) =>
    if (k > 0 && unmatched(k).spec.partitionClass != unmatched(k - 1).spec.partitionClass) stage + 1 else stage
  }.tail

  /** Tasks in a row the routes and the semi joins' settling need; each stage's task k works on partition k of every store. */
  val stageCount: Int = settleStage.lastOption.fold(routeStages)(_ + 1)

  val streams: Seq[Int] = kinds.indices.filter(kinds(_) == InputKind.Stream)

  /** The inputs whose rows live in state stores (see [[umjoin.spark.streaming.StreamingLayout.stored]]). */
  val stored: Seq[Int] = states.keys.toSeq.sorted

  /** Whether input j is a stored static table this batch writes (so its rows come from its child, not its stores). */
  def loads(j: Int): Boolean = staticLoads.get(j).exists(_.load)

  /** The steps (route's start, input probed, index probed through) the routes take in stage `stage`. */
  def probesIn(stage: Int): Seq[(Int, Int, StoreIndex)] = routes.values.toSeq.flatMap { run =>
    run.segments.lift(stage).toSeq.flatMap(seg => (seg.from until seg.until).map(t => (run.start, run.steps(t).input, run.steps(t).index)))
  }

  /** The input's expression for key class `c`. */
  def keyOf(input: Int, c: Int): Expression = graph.classes(c).keyOf(input).get
}

/**
 * One task of one stage of a micro-batch (see [[StreamingUMJoinExec]]). Stage 0 starts the routes
 * from the batch's new rows of every stream, stage s > 0 continues the partial combinations stage
 * s - 1 shipped to this partition; each runs its routes' steps until a step needs another
 * partition, then ships the combination there (to one partition, or all). The last stage writes the
 * batch's new rows into the stores, evicts what can no longer join, and commits.
 *
 * Stores are read as the previous batch committed them; this batch's new rows of an input are
 * indexed in memory from the input's partition and seen by routes that start at a later input.
 * `committed` reports the stores the last stage committed (the operator's state metrics).
 */
private[streaming] final class StageTask(
    job: MicroBatchJob,
    stage: Int,
    context: TaskContext,
    read: Int => Iterator[InternalRow],
    broadcastRows: Int => Array[InternalRow],
    shipped: () => Iterator[InternalRow],
    metrics: StageMetrics,
    storeConfs: InputStateConf,
    hadoopConf: Configuration,
    statistics: Option[ProbeCountersAccumulator],
    committed: Seq[InputStateWriter] => Unit) {

  private val partition = context.partitionId()
  private val isLast = stage == job.stageCount - 1
  private val counters = statistics.map(_ => new ProbeCounters(job.kinds.size))
  private val visible: Long => Boolean = job.stateTtlMs match {
    case Some(ttl) => storedAt => storedAt > job.nowMs - ttl
    case None => _ => true
  }
  // A stored static table's rows never expire: the table is loaded again when it changes.
  private def visibleIn(j: Int): Long => Boolean = if (job.kinds(j) == InputKind.Stream) visible else _ => true

  // The stores of the streams and stored tables: written (and read) in the last stage, read-only before it.
  private val writers = mutable.Map[Int, InputStateWriter]()
  private val readers = mutable.Map[Int, InputState]()
  private def writerOf(j: Int): InputStateWriter =
    writers.getOrElseUpdate(j, InputState.write(job.states(j), job.info, partition, storeConfs, hadoopConf, visibleIn(j), context))
  private def stateOf(j: Int): InputState =
    if (isLast) writerOf(j).state
    else readers.getOrElseUpdate(j, InputState.read(job.states(j), job.info, partition, storeConfs, hadoopConf, visibleIn(j), context))

  /**
   * The input's rows of this batch in this partition that can be in a result: not late, and no NULL
   * in a key that rejects it (a row of an outer join's preserved side is kept whatever its ON key).
   */
  private def fresh(j: Int, late: Option[SQLMetric]): Iterator[InternalRow] = {
    val isLate = job.lateRows(j).map(GeneratedCode.interpreted(_, job.outputs(j), partition))
    val keys = GeneratedCode.projection(job.keysRejectingNull(j), job.outputs(j))
    read(j).filter { row =>
      val dropped = isLate.exists(_.eval(row))
      if (dropped) late.foreach(_ += 1)
      !dropped && !keys(row).anyNull
    }
  }

  /** `rows` of input j indexed in memory by each of `indexes`, as the probe loop looks them up. */
  private def indexInMemory(j: Int, rows: Iterator[InternalRow], indexes: Seq[StoreIndex]): Map[StoreIndex, JoinStore] = {
    val keys = indexes.map(_.classes.map(cl => BindReferences.bindReference(job.keyOf(j, cl), job.outputs(j))))
    val stores = PagedStore.build(rows, keys.map(UMJoinExec.hashable), job.outputs(j), context)
    metrics.memoryIndexBytes += stores.map(_.sizeInBytes).sum
    indexes.zip(stores).zip(keys).map { case ((index, store), key) => index -> StageTask.keyedAsBuilt(store, key) }.toMap
  }

  // In-memory indexes, built when first probed: this batch's new rows of streams, and static tables.
  private val probed = job.probesIn(stage)
  private val memoryIndexes = mutable.Map[Int, Map[StoreIndex, JoinStore]]()
  private def inMemory(j: Int, index: StoreIndex): JoinStore = memoryIndexes.getOrElseUpdate(j, {
    // (An outer input's new rows are looked up by every route: a combination is padded only if none matches.)
    val indexes = probed.collect { case (start, `j`, ix) if job.kinds(j) != InputKind.Stream || j < start || job.graph.outer.contains(j) => ix }.distinct
    val rows = job.kinds(j) match {
      case InputKind.Stream => fresh(j, None)
      case InputKind.StaticBroadcast => broadcastRows(j).iterator
      case InputKind.StaticPartitioned | InputKind.StaticStored => read(j)
    }
    indexInMemory(j, rows, indexes)
  })(index)

  // A stream's stored rows, read into memory once where this partition holds few of them
  // (spark.umjoin.stateCacheRows): most probes of a multi-way join find nothing, and a hash lookup
  // costs far less than a seek in the state store's LSM-tree. The committed version is read, before
  // the last stage writes this batch's rows.
  private val cachedState = mutable.Map[Int, Option[Map[StoreIndex, JoinStore]]]()
  private def stored(j: Int, index: StoreIndex): JoinStore = cachedState.getOrElseUpdate(j, {
    CommittedRowCounts.of(job.info, partition, j).filter(n => n > 0 && n <= job.stateCacheRows).map { n =>
      metrics.cachedStateRows += n
      indexInMemory(j, stateOf(j).visibleRows(), probed.collect { case (_, `j`, ix) => ix }.distinct)
    }
  }).map(_(index)).getOrElse(stateOf(j).storeFor(index))

  // A stored static table between its loads: its stores, through what this executor caches of them.
  private def staticCacheOf(j: Int): StaticInputCache = {
    val spec = job.states(j)
    val (masterRowBytes, streamRowBytes) = job.staticRowBytes(j)
    StaticCaches.of(job.info, partition, j, job.staticLoads(j).generation, new StaticInputCache(job.staticLoads(j).generation, job.staticCache,
      StoreIndex.single(spec.partitionClass),
      spec.allIndexes.map { case (ix, keys) => ix -> BindReferences.bindReferences(keys, spec.output) }.toMap,
      masterRowBytes, streamRowBytes))
  }
  private val staticViews = mutable.Map[(Int, StoreIndex), JoinStore]()
  private def staticStored(j: Int, index: StoreIndex): JoinStore = staticViews.getOrElseUpdate((j, index), {
    val m = metrics.static(j)
    staticCacheOf(j).view(index, stateOf(j).storeFor(index), () => stateOf(j).visibleRows(), m.hits, m.misses)
  })

  private def seesNewRows(tag: Int, input: Int): Boolean = input < tag && !job.isRescan(tag)

  /**
   * The store the route of `tag` probes input `input` through `index` with (the delta rule: later
   * starts see this batch's rows; the rescan sees none: its combinations have no new row).
   */
  private def storeFor(tag: Int, input: Int, index: StoreIndex): JoinStore = job.kinds(input) match {
    case InputKind.Stream if seesNewRows(tag, input) => new StageTask.Both(stored(input, index), inMemory(input, index))
    case InputKind.Stream => stored(input, index)
    case InputKind.StaticStored if !job.loads(input) => staticStored(input, index)
    case _ => inMemory(input, index)
  }

  // Per semi join's input, new combinations of its preserved inputs that no row of it matched in this task (or, in
  // the stage that settles them, that earlier stages shipped here, or the semi join below let through): they wait for a
  // match in the store that stage writes.
  private val unmatchedHere = job.unmatched.map(_.nonPreserved -> mutable.ArrayBuffer[UnsafeRow]()).toMap
  // The semi joins (by their index in job.unmatched) this stage settles, and the combinations the ones below them let
  // through in the stage before, each with the index of the first semi join it is tried on here.
  private val settledHere = job.unmatched.indices.filter(job.settleStage(_) == stage)
  private val passedOn = mutable.ArrayBuffer[(Int, UnsafeRow)]()
  private def semiIndex(input: Int): Int = job.unmatched.indexWhere(_.nonPreserved == input)

  /** Whether a shipped combination waiting for semi join input `tag` names, or passed on to it, is this stage's to settle. */
  private def settlesHere(tag: Int): Boolean =
    StageTask.isPassedOn(tag) || settledHere.contains(semiIndex(StageTask.semiInput(tag)))

  /** Keeps a combination this stage settles (see [[settlesHere]]) until it settles its semi join. */
  private def keepToSettle(tag: Int, row: InternalRow): Unit = {
    val k = semiIndex(StageTask.semiInput(tag))
    val kept = row.asInstanceOf[UnsafeRow].copy()
    if (StageTask.isPassedOn(tag)) passedOn += ((k, kept)) else unmatchedHere(job.unmatched(k).nonPreserved) += kept
  }

  /** This stage's part of each route, ready to run (compiled when first used). */
  private val cores = mutable.Map[Int, (Route.Segment, ProbeCore)]()
  private def coreOf(tag: Int): (Route.Segment, ProbeCore) = cores.getOrElseUpdate(tag, {
    val run = job.planOf(tag)
    val segment = run.segments(stage)
    val rescan = job.isRescan(tag)
    // An outer step pads where no row of its input there is matches: the route binds the stored ones (and the new ones, where
    // it sees them), so the new ones are checked where it does not.
    val padding = job.padding.map(p => StreamPadding((input, index) => if (seesNewRows(tag, input)) null else inMemory(input, index),
      p.now.get, Option.when(rescan)(p.rescanned(tag - job.kinds.size)), Option.when(rescan)(p.due(tag - job.kinds.size))))
    val compiled = CompiledRoute.segment(run, segment.from, segment.until, job.outputs, job.result,
      (input, index) => storeFor(tag, input, index), identity, metrics.inputs, partition, Option.when(job.unmatched.nonEmpty) {
        (semi: Int, bound: Seq[Attribute]) =>
          val inInputOrder = UnsafeProjection.create(job.unmatched.find(_.nonPreserved == semi).get.spec.output, bound)
          (combination: InternalRow) => unmatchedHere(semi) += inInputOrder(combination).copy()
      }, padding)
    (segment, new ProbeCore(compiled, Option.when(stage == 0 && !rescan)(metrics.inputs(run.start).rowsIn),
      Option.when(segment.next.isEmpty)(metrics.numOutputRows), context, counters))
  })

  /** Rows this stage produces, each with its tag (see [[StageTask.ResultRow]]). */
  private def produced(): Iterator[(Int, InternalRow)] = {
    def label(start: Int, rows: Iterator[InternalRow], segment: Route.Segment): Iterator[(Int, InternalRow)] =
      rows.map(row => (if (segment.next.isEmpty) StageTask.ResultRow else start, row))
    if (stage == 0) {
      val routes = job.streams.iterator.filter(job.routes.contains).flatMap { start =>
        val (segment, core) = coreOf(start)
        label(start, core.join(fresh(start, None)), segment)
      }
      // The combinations of stored rows only that become due padded now: rescanned from the stored rows of the streams the joins' watermarks read.
      val rescans = job.padding.iterator.flatMap(_.rescanStarts).flatMap { start =>
        val tag = job.kinds.size + start
        val (segment, core) = coreOf(tag)
        label(tag, core.join(stateOf(start).visibleRows()), segment)
      }
      routes ++ rescans
    } else {
      val feeds = mutable.Map[Int, (Route.Segment, StageTask.Feed, Iterator[InternalRow])]()
      val resultRow = new UnsafeRow(job.result.size)
      // (Every semi join's waiting combinations have the same columns: its preserved side is every input that binds rows.)
      val unmatchedRow = new UnsafeRow(job.unmatched.headOption.map(_.spec.output.size).getOrElse(0))
      // With time-sliced stores, the shuffle's reading of each combination is timed (its part of T_s).
      val arriving = metrics.sliceCosts.fold(shipped()) { costs =>
        new StageTask.TimedWithin[InternalRow](shipped(), costs.shipNanos, row => StageTask.continuesRoute(row.getInt(0)))
      }
      arriving.flatMap { shippedRow =>
        val envelope = shippedRow.asInstanceOf[UnsafeRow]
        val start = envelope.getInt(0)
        if (StageTask.waits(start)) {
          StageTask.pointToContent(unmatchedRow, envelope)
          Iterator.single((start, unmatchedRow))
        } else if (start == StageTask.ResultRow) {
          StageTask.pointToContent(resultRow, envelope)
          Iterator.single((StageTask.ResultRow, resultRow))
        } else {
          val (segment, feed, rows) = feeds.getOrElseUpdate(start, {
            val (segment, core) = coreOf(start)
            val feed = new StageTask.Feed(job.boundBy(start, segment.from + 1).map(job.outputs(_).size).sum)
            // Probing a time-sliced store is timed (T_j, with the rows its conditions test).
            val probing = job.planOf(start).steps(segment.from).input
            val probeNanos = metrics.sliceCosts.flatMap(_.probeNanos.get(probing))
            (segment, feed, probeNanos.fold(core.join(feed))(nanos => new StageTask.TimedWithin(core.join(feed), nanos, (_: InternalRow) => true)))
          })
          feed.set(envelope)
          label(start, rows, segment)
        }
      }
    }
  }

  /** A stage before the last: its rows, each addressed to the partition it continues in. */
  def shipping(): Iterator[(Int, InternalRow)] = {
    val envelope = new UnsafeRowWriter(2)
    val copied = ShuffleWrites.keepRows(job.partitions)
    // The envelope: the tag, then the row's bytes, copied once, from where they are.
    def wrap(start: Int, row: InternalRow): UnsafeRow = {
      val bytes = row.asInstanceOf[UnsafeRow]
      envelope.reset()
      envelope.zeroOutNullBytes()
      envelope.write(0, start)
      bytes.getBaseObject match {
        case array: Array[Byte] => envelope.write(1, array, (bytes.getBaseOffset - Platform.BYTE_ARRAY_OFFSET).toInt, bytes.getSizeInBytes)
        case _ => envelope.write(1, bytes.getBytes)
      }
      if (copied) envelope.getRow.copy() else envelope.getRow
    }
    /** The partition of a row of `attributes` whose store is partitioned by `key` (the one Spark's shuffle of that key gives it). */
    def partitionOf(key: Expression, attributes: Seq[Attribute]): UnsafeProjection =
      UnsafeProjection.create(Seq(HashPartitioning(Seq(key), job.partitions).partitionIdExpression), attributes)
    val targets = mutable.Map[Int, UnsafeProjection]()
    def targetOf(start: Int, segment: Route.Segment, keyClass: Int): UnsafeProjection = targets.getOrElseUpdate(start, {
      val bound = job.boundBy(start, segment.until + 1)
      val value = bound.flatMap(x => job.graph.classes(keyClass).keyOf(x)).head
      partitionOf(value, bound.flatMap(job.outputs))
    })
    // Into a store spread by time slice: to the partitions of the slices the combination's time range overlaps.
    val slicesOf = mutable.Map[Int, Option[(Int, SliceWindow, UnsafeProjection)]]()
    def sliceTargets(start: Int, segment: Route.Segment): Option[(Int, SliceWindow, UnsafeProjection)] = slicesOf.getOrElseUpdate(start, {
      val run = job.planOf(start)
      val bound = job.boundBy(start, segment.until + 1)
      val input = run.steps(segment.until).input
      job.slices.get(input).map { window =>
        val known = window.copy(bounds = window.bounds.filter(b => bound.contains(b.input)))
        (input, known, UnsafeProjection.create(known.bounds.map(_.time), bound.flatMap(job.outputs)))
      }
    })
    val all = 0 until job.partitions
    // Unmatched combinations stay in this partition (their non-preserved input's store's) until the stage that settles them.
    val unmatched = () => job.unmatched.indices.filter(job.settleStage(_) > stage).iterator.flatMap { k =>
      val semi = job.unmatched(k).nonPreserved
      unmatchedHere(semi).iterator.map(row => (partition, wrap(StageTask.unmatchedTag(semi), row)))
    }
    // The semi joins settled here: their result rows go on to the last stage, the combinations they let through to the next semi join's partition.
    val semiTargets = mutable.Map[Int, UnsafeProjection]()
    def semiTargetOf(semi: UnmatchedSpec): UnsafeProjection =
      semiTargets.getOrElseUpdate(semi.nonPreserved, partitionOf(semi.spec.partitionKey, semi.spec.output))
    val settled = () => if (settledHere.isEmpty) Iterator.empty else {
      val (results, onward) = settleUnmatched()
      commitUnmatched()
      committed(unmatchedWriters.toSeq)
      results.iterator.map(row => (partition, wrap(StageTask.ResultRow, row))) ++ onward.iterator.map { case (k, combination) =>
        val semi = job.unmatched(k)
        (semiTargetOf(semi)(combination).getInt(0), wrap(StageTask.passedOnTag(semi.nonPreserved), combination))
      }
    }
    val addressed = StageTask.whenDone(produced().flatMap {
      case (tag, row) if StageTask.waits(tag) && settlesHere(tag) =>
        keepToSettle(tag, row)
        Iterator.empty
      // A result row or a waiting combination stays in this partition (one goes on only to the last stage).
      case (tag, row) if !StageTask.continuesRoute(tag) => Iterator.single((partition, wrap(tag, row)))
      case (start, row) =>
        val segment = job.planOf(start).segments(stage)
        segment.next match {
          case Some(Route.Reach.ByKey(keyClass)) =>
            metrics.shipped += 1
            Iterator.single((targetOf(start, segment, keyClass)(row).getInt(0), wrap(start, row)))
          case _ =>
            val wrapped = wrap(start, row)
            val targets = sliceTargets(start, segment).fold(all.iterator) { case (input, window, times) =>
              metrics.sliceCosts.foreach(_.combinations(input) += 1)
              window.partitionsFor(times(row))
            }
            targets.map { p =>
              metrics.shipped += 1
              (p, wrapped)
            }
        }
    } ++ settled() ++ unmatched(), () => report())
    // With time-sliced stores, the shuffle's writing of each combination is timed (its part of T_s).
    metrics.sliceCosts.fold(addressed) { costs =>
      new StageTask.TimedOutside[(Int, UnsafeRow)](addressed, costs.shipNanos, { case (_, row) => StageTask.continuesRoute(row.getInt(0)) })
    }
  }

  /**
   * The last stage: result rows, then the semi joins' combinations matched at last; once they are
   * all out, the batch's new rows are stored and every store is committed.
   */
  def results(): Iterator[InternalRow] = {
    val rows = produced().flatMap {
      case (tag, row) if StageTask.waits(tag) =>
        if (!settlesHere(tag)) throw new IllegalStateException("UMJoin: a semi join's waiting combination reached the last stage, which does not settle it")
        keepToSettle(tag, row)
        Iterator.empty
      case (_, row) => Iterator.single(row)
    }
    // (The last stage settles the last semi joins: nothing goes on past them.)
    StageTask.whenDone(rows ++ (if (settledHere.isEmpty) Iterator.empty else settleUnmatched()._1.iterator), () => finish())
  }

  private val unmatchedWriters = mutable.ArrayBuffer[InputStateWriter]()

  /**
   * The waiting combinations of the semi joins this stage settles (in this partition, lowest join
   * first, the ones already stored and this batch's new ones): those a new row of the join's input
   * matches go on to the join above; those no later row can match any more are dropped; the others
   * wait. A combination going on is tried on the rows the joins above stored, up to the last this
   * stage settles (their stores share this partition): it waits at the first none of whose rows
   * matches, or, past them all, comes out or goes on to the next semi join's partition. Returns the
   * result rows, and the combinations going on, each with the index of the semi join they go on to.
   */
  private def settleUnmatched(): (Seq[InternalRow], Seq[(Int, UnsafeRow)]) = {
    val out = mutable.ArrayBuffer[InternalRow]()
    val onward = mutable.ArrayBuffer[(Int, UnsafeRow)]()
    val joined = new JoinedRow
    // Where a combination finds a match: a row of the join's input (stored or new) meeting its condition.
    def finder(u: UnmatchedSpec, rows: JoinStore): InternalRow => Boolean = {
      val keyOf = UnsafeProjection.create(Seq(u.spec.partitionKey), u.spec.output)
      val on = u.onCondition.map(GeneratedCode.predicate(_, u.spec.output ++ job.outputs(u.nonPreserved), partition))
      combination => rows.get(keyOf(combination)).exists(row => on.forall(_.eval(joined(combination, row))))
    }
    def matchIndex(k: Int): StoreIndex = StoreIndex.single(job.unmatched(k).spec.partitionClass)
    // A semi join's result reads none of its non-preserved inputs' columns.
    val result = job.unmatched.headOption.map(u => UnsafeProjection.create(job.result, u.spec.output))
    val storedMatches = mutable.Map[Int, InternalRow => Boolean]()
    def storedMatch(k: Int): InternalRow => Boolean = storedMatches.getOrElseUpdate(k, {
      val u = job.unmatched(k)
      finder(u, stateOf(u.nonPreserved).storeFor(matchIndex(k)))
    })
    /** A combination the semi joins below the `a`-th let through. */
    def tryFrom(a: Int, combination: InternalRow): Unit = {
      val here = (a until job.unmatched.size).takeWhile(job.settleStage(_) == stage)
      here.find(b => !storedMatch(b)(combination)) match {
        case Some(b) => unmatchedHere(job.unmatched(b).nonPreserved) += combination.asInstanceOf[UnsafeRow].copy()
        case None if a + here.size < job.unmatched.size => onward += ((a + here.size, combination.asInstanceOf[UnsafeRow].copy()))
        case None => out += result.get(combination).copy()
      }
    }
    passedOn.foreach { case (a, combination) => tryFrom(a, combination) }
    settledHere.foreach { k =>
      val u = job.unmatched(k)
      val writer = InputState.write(u.spec, job.info, partition, storeConfs, hadoopConf, _ => true, context)
      unmatchedWriters += writer
      val matched = finder(u, indexInMemory(u.nonPreserved, fresh(u.nonPreserved, None), Seq(matchIndex(k)))(matchIndex(k)))
      val unmatchable = u.unmatchable.map(GeneratedCode.interpreted(_, u.spec.output, partition))
      /** Whether the combination goes: matched now (it goes on), or matched by no later row (it is dropped). */
      def goes(combination: InternalRow): Boolean =
        if (matched(combination)) {
          tryFrom(k + 1, combination)
          true
        } else if (unmatchable.exists(_.eval(combination))) {
          metrics.unmatched(u.nonPreserved).gone += 1
          true
        } else false
      metrics.removed += writer.removeWhere((_, combination) => goes(combination))
      // A combination new to the join in this batch that its state watermark rules out: Spark's join does not store it,
      // so no row of this batch (they probe its state) matches it; the stored ones it was tried on did not.
      unmatchedHere(u.nonPreserved).foreach { combination =>
        if (unmatchable.exists(_.eval(combination))) metrics.unmatched(u.nonPreserved).gone += 1
        else if (!goes(combination)) {
          writer.put(combination, job.nowMs)
          metrics.updated += 1
        }
      }
    }
    metrics.numOutputRows += out.size
    (out.toSeq, onward.toSeq)
  }

  /** Commits the stores of the semi joins' waiting combinations this stage settled. */
  private def commitUnmatched(): Unit = {
    settledHere.zip(unmatchedWriters).foreach { case (k, writer) =>
      writer.commit()
      metrics.unmatched(job.unmatched(k).nonPreserved).waiting += writer.rowCount
    }
  }

  private def finish(): Unit = {
    job.stored.foreach { j =>
      val writer = writerOf(j)
      def store(rows: Iterator[InternalRow]): Unit = rows.foreach { row =>
        writer.put(row, job.nowMs)
        metrics.updated += 1
      }
      job.kinds(j) match {
        case InputKind.Stream =>
          // A sliced stream's event times are reported from the scan that evicts rows: those of the rows it keeps, and of
          // those among them stored in this batch (a late row evicted at once is no measure of the rate rows come at).
          // The next batch's slicing is cut past the former, balanced by both's rates.
          val times = metrics.slicedRows.get(j).map { accumulator =>
            (accumulator, eventTimeOf(j))
          }
          val stored = new EventTimes.Counter
          val arrived = new EventTimes.Counter
          store(fresh(j, Some(metrics.droppedLate)))
          val evict = job.evictable(j).map(GeneratedCode.interpreted(_, job.outputs(j), partition))
          if (job.stateTtlMs.isDefined || evict.isDefined || times.isDefined) {
            metrics.removed += writer.removeWhere { (storedAt, row) =>
              val gone = !visible(storedAt) || evict.exists(_.eval(row))
              times.foreach { case (_, time) =>
                val t = time(row)
                if (!gone && !t.isNullAt(0)) {
                  stored.add(t.getLong(0))
                  if (storedAt == job.nowMs) arrived.add(t.getLong(0))
                }
              }
              gone
            }
          }
          times.foreach { case (accumulator, _) => accumulator.add(SlicedRows(Set(partition), stored.times, arrived.times)) }
        case _ if job.loads(j) =>
          metrics.removed += writer.removeWhere((_, _) => true)
          store(fresh(j, None))
        case _ =>
          val cache = staticCacheOf(j)
          cache.endBatch(writer.state.storeFor(StoreIndex.single(job.states(j).partitionClass)))
          metrics.static(j).cachedKeys += cache.cachedKeys
          metrics.static(j).cachedBytes += cache.cachedBytes
      }
      // Counted before the commit: a committed RocksDB store can no longer be read in this task.
      metrics.sliceDrains.get(j).foreach { drain =>
        val window = job.slices(j)
        val time = eventTimeOf(j)
        drain.earlierPlaced += writer.state.visibleRows().count { row =>
          val t = time(row)
          !t.isNullAt(0) && window.placement(t.getLong(0)) != partition
        }
        drain.partitionsCounted.add(1)
      }
      writer.commit()
      metrics.static.get(j).foreach(_.diskBytes += writer.diskBytes)
      CommittedRowCounts.record(job.info, partition, j, job.info.storeVersion + 1, writer.rowCount)
      metrics.stateRows(j) += writer.rowCount
      metrics.indexEntries(j) += writer.indexEntryCount
      if (writer.rowCount > 0) metrics.slicePartitions.get(j).foreach(_ += 1)
      metrics.inputs(j).storeSize += writer.memoryBytes
      counters.foreach(_.stored(j) = writer.rowCount)
    }
    commitUnmatched()
    committed(writers.toSeq.sortBy(_._1).map(_._2) ++ unmatchedWriters)
    report()
  }

  /** A time-sliced stream's event time, read from its stored rows. */
  private def eventTimeOf(j: Int): UnsafeProjection =
    GeneratedCode.projection(Seq(job.states(j).partitionKey.asInstanceOf[TimeSlice].child), job.outputs(j))

  private def report(): Unit = statistics.foreach(accumulator => counters.foreach(accumulator.add))
}

private[streaming] object StageTask {

  // A row shipped between stages is tagged with what it is: a partial combination of the route that
  // starts at input `tag` (tag >= 0, going on there), or one of these.
  /** A complete result row (it only travels to the last stage). */
  val ResultRow: Int = -1
  /** A combination no row of semi join input `semi` matched yet (it waits in its partition for the stage that settles it). */
  def unmatchedTag(semi: Int): Int = -2 - 2 * semi
  /** A combination the semi joins below semi join input `semi` let through (it is tried on that join's rows in the stage that settles it). */
  def passedOnTag(semi: Int): Int = -3 - 2 * semi
  /** Whether the row is a combination waiting for a semi join, or passed on to one. */
  def waits(tag: Int): Boolean = tag <= -2
  def isPassedOn(tag: Int): Boolean = waits(tag) && (-2 - tag) % 2 == 1
  def semiInput(tag: Int): Int = (-2 - tag) / 2
  def continuesRoute(tag: Int): Boolean = tag >= 0

  /**
   * Points `row` at the row a shipped envelope holds, in the envelope's own buffer: valid until the
   * next envelope is read, as every row of a shuffle's reader (no copy of its bytes).
   */
  def pointToContent(row: UnsafeRow, envelope: UnsafeRow): Unit = {
    val offsetAndSize = envelope.getLong(1)
    row.pointTo(envelope.getBaseObject, envelope.getBaseOffset + (offsetAndSize >>> 32), offsetAndSize.toInt)
  }

  /** The partial combinations of one route arriving at a task, one at a time, as the probe loop's input. */
  final class Feed(numFields: Int) extends Iterator[InternalRow] {
    private val row = new UnsafeRow(numFields)
    private var pending = false
    def set(envelope: UnsafeRow): Unit = {
      pointToContent(row, envelope)
      pending = true
    }
    override def hasNext: Boolean = pending
    override def next(): InternalRow = {
      pending = false
      row
    }
  }

  /** A stream's stored rows and this batch's new ones. */
  final class Both(stored: JoinStore, fresh: JoinStore) extends JoinStore {
    override def get(key: UnsafeRow): Iterator[InternalRow] = stored.get(key) ++ fresh.get(key)
    override def isEmpty: Boolean = false
    override def keyCount: Long = stored.keyCount + fresh.keyCount
    override def sizeInBytes: Long = stored.sizeInBytes + fresh.sizeInBytes
    override def close(): Unit = ()
  }

  /** An in-memory index keyed as [[UMJoinExec.hashable]] keys it, probed with keys of the classes' own types. */
  def keyedAsBuilt(store: JoinStore, keys: Seq[Expression]): JoinStore =
    if (UMJoinExec.hashable(keys) == keys) store
    else new JoinStore {
      private val widen = UnsafeProjection.create(UMJoinExec.hashable(keys.zipWithIndex.map { case (k, i) => BoundReference(i, k.dataType, nullable = false) }))
      override def get(key: UnsafeRow): Iterator[InternalRow] = store.get(widen(key))
      override def isEmpty: Boolean = store.isEmpty
      override def keyCount: Long = store.keyCount
      override def sizeInBytes: Long = store.sizeInBytes
      override def close(): Unit = store.close()
    }

  /**
   * `rows`, adding to `nanos` the time spent getting them: a row's (with the time since the row
   * before) where `counted`, dropped where not, and the time finding that they ran out.
   */
  final class TimedWithin[T](rows: Iterator[T], nanos: SQLMetric, counted: T => Boolean) extends Iterator[T] {
    private var spent = 0L
    override def hasNext: Boolean = {
      val started = System.nanoTime()
      val more = rows.hasNext
      spent += System.nanoTime() - started
      if (!more) {
        nanos += spent
        spent = 0L
      }
      more
    }
    override def next(): T = {
      val started = System.nanoTime()
      val row = rows.next()
      spent += System.nanoTime() - started
      if (counted(row)) nanos += spent
      spent = 0L
      row
    }
  }

  /**
   * `rows`, adding to `nanos` the time their consumer (a shuffle's writer) takes with each row
   * `counted`: from handing it over until it asks for the next.
   */
  final class TimedOutside[T](rows: Iterator[T], nanos: SQLMetric, counted: T => Boolean) extends Iterator[T] {
    private var handedOver = false
    private var handedAt = 0L
    private def back(): Unit = if (handedOver) {
      nanos += System.nanoTime() - handedAt
      handedOver = false
    }
    override def hasNext: Boolean = {
      back()
      rows.hasNext
    }
    override def next(): T = {
      back()
      val row = rows.next()
      if (counted(row)) {
        handedOver = true
        handedAt = System.nanoTime()
      }
      row
    }
  }

  /** `rows`, then `done()` once they ran out. */
  def whenDone[T](rows: Iterator[T], done: () => Unit): Iterator[T] = new Iterator[T] {
    private var finished = false
    override def hasNext: Boolean = rows.hasNext || {
      if (!finished) {
        finished = true
        done()
      }
      false
    }
    override def next(): T = rows.next()
  }
}

/** The shuffle of partial combinations between two stages: each row goes to the partition it is addressed to. */
object ComboShuffle {
  def apply(mapSide: RDD[(Int, InternalRow)], partitions: Int, sc: SparkContext): RDD[InternalRow] = {
    val writeMetrics = SQLShuffleWriteMetricsReporter.createShuffleWriteMetrics(sc)
    val dependency = new ShuffleDependency[Int, InternalRow, InternalRow](mapSide, new AddressedPartitioner(partitions),
      new UnsafeRowSerializer(2), shuffleWriterProcessor = ShuffleExchangeExec.createShuffleWriteProcessor(writeMetrics))
    new ShuffledRowRDD(dependency, SQLShuffleReadMetricsReporter.createShuffleReadMetrics(sc))
  }

  private final class AddressedPartitioner(override val numPartitions: Int) extends Partitioner {
    override def getPartition(key: Any): Int = key.asInstanceOf[Int]
  }
}
