package umjoin.spark.streaming

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{BindReferences, UnsafeProjection}
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.sql.execution.streaming.state.StateStore

import org.apache.spark.sql.execution.umjoin.PagedStore
import umjoin.spark.batch.UMJoinExec
import umjoin.spark.core.GeneratedCode
import umjoin.spark.core.cost.ProbeCounters
import umjoin.spark.core.probe.StoreIndex
import umjoin.spark.core.store.JoinStore

/**
 * Where one task of a micro-batch's stage reads and writes each input's rows: the stores as the
 * previous batch committed them (written, and committed, by the last stage), this batch's new rows
 * indexed in memory, a stream's few stored rows read into memory, and a stored static table through
 * what the executor caches of it.
 */
private[streaming] final class StageStores(
    job: MicroBatchJob,
    stage: Int,
    context: TaskContext,
    read: Int => Iterator[InternalRow],
    broadcastRows: Int => Array[InternalRow],
    metrics: StageMetrics,
    storeConfs: InputStateConf,
    hadoopConf: Configuration,
    counters: Option[ProbeCounters]) {

  private val partition = context.partitionId()
  private val isLast = stage == job.stageCount - 1
  private val visible: Long => Boolean = job.spec.stateTtlMs match {
    case Some(ttl) => storedAt => storedAt > job.nowMs - ttl
    case None => _ => true
  }
  // A stored static table's rows never expire: the table is loaded again when it changes.
  private def visibleIn(j: Int): Long => Boolean =
    if (job.layout.kinds(j) == InputKind.Stream) visible else _ => true

  // The stores of the streams and stored tables: written (and read) in the last stage, read-only
  // before it.
  private val partitionStores =
    new PartitionStores(job.layout.stores, job.info, partition, storeConfs, hadoopConf, context)
  private val writers = mutable.Map[Int, InputStateWriter]()
  private val readers = mutable.Map[Int, InputState]()
  /** How long this task spent writing, evicting and committing (see [[StoreTimes]]). */
  val storeTimes = new StoreTimes
  /** The store instances this task wrote. */
  def instances: Seq[StateStore] = partitionStores.instances
  private def writerOf(j: Int): InputStateWriter =
    writers.getOrElseUpdate(j, InputState.write(job.states(j), partitionStores, storeConfs,
      visibleIn(j)))
  def stateOf(j: Int): InputState =
    if (isLast) writerOf(j).state
    else readers.getOrElseUpdate(j, InputState.read(job.states(j), partitionStores, storeConfs,
      visibleIn(j)))

  /**
   * The input's rows of this batch in this partition that can be in a result: not late, and no NULL
   * in a key that rejects it (a row of an outer join's preserved side is kept whatever its ON key).
   */
  def fresh(j: Int, late: Option[SQLMetric]): Iterator[InternalRow] = {
    val isLate = job.lateRows(j).map(GeneratedCode.interpreted(_, job.outputs(j), partition))
    val keys = GeneratedCode.projection(job.keysRejectingNull(j), job.outputs(j))
    read(j).filter { row =>
      val dropped = isLate.exists(_.eval(row))
      if (dropped) late.foreach(_ += 1)
      !dropped && !keys(row).anyNull
    }
  }

  /** `rows` of input j indexed in memory by each of `indexes`, as the probe loop looks them up. */
  def indexInMemory(j: Int, rows: Iterator[InternalRow],
      indexes: Seq[StoreIndex]): Map[StoreIndex, JoinStore] = {
    val keys = indexes.map(_.classes.map(cl =>
      BindReferences.bindReference(job.keyOf(j, cl), job.outputs(j))))
    val stores = PagedStore.build(rows, keys.map(UMJoinExec.hashable), job.outputs(j), context)
    metrics.memoryIndexBytes += stores.map(_.sizeInBytes).sum
    indexes.zip(stores).zip(keys).map { case ((index, store), key) =>
      index -> StageTask.keyedAsBuilt(store, key) }.toMap
  }

  // In-memory indexes, built when first probed: this batch's new rows of streams, and static
  // tables.
  private val probed = job.probesIn(stage)
  private val memoryIndexes = mutable.Map[Int, Map[StoreIndex, JoinStore]]()
  def inMemory(j: Int, index: StoreIndex): JoinStore = memoryIndexes.getOrElseUpdate(j, {
    // (An outer input's new rows are looked up by every route: a combination is padded only if none
    // matches.)
    val indexes = probed.collect {
      case (start, `j`, ix) if job.layout.kinds(j) != InputKind.Stream || j < start ||
        job.graph.outer.contains(j) => ix
    }.distinct
    val rows = job.layout.kinds(j) match {
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
    CommittedRowCounts.of(job.info, partition, j)
      .filter(n => n > 0 && n <= job.spec.stateCacheRows)
      .map { n =>
        metrics.cachedStateRows += n
        indexInMemory(j, stateOf(j).visibleRows(),
          probed.collect { case (_, `j`, ix) => ix }.distinct)
      }
  }).map(_(index)).getOrElse(stateOf(j).storeFor(index))

  // A stored static table between its loads: its stores, through what this executor caches of them.
  private def staticCacheOf(j: Int): StaticInputCache = {
    val spec = job.states(j)
    val (masterRowBytes, streamRowBytes) = job.staticRowBytes(j)
    StaticCaches.of(job.info, partition, j, job.staticLoads(j).generation,
      new StaticInputCache(job.staticLoads(j).generation, job.spec.staticCache,
        StoreIndex.single(spec.partitionClass),
        spec.allIndexes.map { case (ix, keys) =>
          ix -> BindReferences.bindReferences(keys, spec.output) }.toMap,
        masterRowBytes, streamRowBytes))
  }
  private val staticViews = mutable.Map[(Int, StoreIndex), JoinStore]()
  private def staticStored(j: Int,
      index: StoreIndex): JoinStore = staticViews.getOrElseUpdate((j, index), {
    val m = metrics.static(j)
    staticCacheOf(j).view(index, stateOf(j).storeFor(index), () => stateOf(j).visibleRows(),
      m.hits, m.misses)
  })

  /**
   * The delta rule: later starts see this batch's rows; a rescan sees none (its combinations have
   * no new row).
   */
  def seesNewRows(partial: Shipped.Partial, input: Int): Boolean = partial match {
    case Shipped.NewRows(start) => input < start
    case Shipped.Rescan(_) => false
  }

  /** The store a partial combination probes input `input` through `index` with. */
  def storeFor(partial: Shipped.Partial, input: Int,
      index: StoreIndex): JoinStore = job.layout.kinds(input) match {
    case InputKind.Stream if seesNewRows(partial, input) =>
      new StageTask.Both(stored(input, index), inMemory(input, index))
    case InputKind.Stream => stored(input, index)
    case InputKind.StaticStored if !job.loads(input) => staticStored(input, index)
    case _ => inMemory(input, index)
  }

  /**
   * The last stage's work on the stores: each stored input's rows of this batch stored, what can no
   * longer join evicted (a stored static table: loaded again, or its cache's keys chosen again),
   * then every store committed and each input's measured.
   */
  def writeAndCommit(stored: Seq[Int]): Unit = {
    stored.foreach(write)
    storeTimes.committing(partitionStores.commit())
    stored.foreach(measure)
  }

  private def write(j: Int): Unit = {
    val writer = writerOf(j)
    def store(rows: Iterator[InternalRow]): Unit = storeTimes.updating(rows.foreach { row =>
      writer.put(row, job.nowMs)
      metrics.updated += 1
    })
    job.layout.kinds(j) match {
      case InputKind.Stream =>
        // A sliced stream's event times are reported from the scan that evicts rows: those of the
        // rows it keeps, and of those among them stored in this batch (a late row evicted at once
        // is no measure of the rate rows come at). The next batch's slicing is cut past the
        // former, balanced by both's rates.
        val times = metrics.slicedRows.get(j).map { accumulator =>
          (accumulator, eventTimeOf(j))
        }
        val stored = new EventTimes.Counter
        val arrived = new EventTimes.Counter
        store(fresh(j, Some(metrics.droppedLate)))
        val evict = job.evictable(j).map(GeneratedCode.interpreted(_, job.outputs(j), partition))
        if (job.spec.stateTtlMs.isDefined || evict.isDefined || times.isDefined) {
          metrics.removed += storeTimes.removing(writer.removeWhere { (storedAt, row) =>
            val gone = !visible(storedAt) || evict.exists(_.eval(row))
            times.foreach { case (_, time) =>
              val t = time(row)
              if (!gone && !t.isNullAt(0)) {
                stored.add(t.getLong(0))
                if (storedAt == job.nowMs) arrived.add(t.getLong(0))
              }
            }
            gone
          })
        }
        times.foreach { case (accumulator, _) =>
          accumulator.add(SlicedRows(Set(partition), stored.times, arrived.times)) }
      case _ if job.loads(j) =>
        metrics.removed += storeTimes.removing(writer.removeWhere((_, _) => true))
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
  }

  private var kept = 0L
  /** The rows the stored inputs' stores hold, once committed. */
  def rowsKept: Long = kept

  private def measure(j: Int): Unit = {
    val writer = writerOf(j)
    kept += writer.rowCount
    metrics.static.get(j).foreach(_.diskBytes += writer.diskBytes)
    CommittedRowCounts.record(job.info, partition, j, job.info.storeVersion + 1, writer.rowCount)
    metrics.stateRows(j) += writer.rowCount
    metrics.indexEntries(j) += writer.indexEntryCount
    if (writer.rowCount > 0) metrics.slicePartitions.get(j).foreach(_ += 1)
    metrics.inputs(j).storeSize += writer.memoryBytes
    counters.foreach(_.stored(j) = writer.rowCount)
  }

  /** A time-sliced stream's event time, read from its stored rows. */
  private def eventTimeOf(j: Int): UnsafeProjection =
    GeneratedCode.projection(Seq(job.states(j).partitionKey.asInstanceOf[TimeSlice].child),
      job.outputs(j))
}

/**
 * The time a task spends on its stores, reported as Spark reports its own stateful operators' in
 * the query's progress (`allUpdatesTimeMs`, `allRemovalsTimeMs`, `commitTimeMs`): storing the
 * batch's rows, evicting what can no longer join, committing. Summed in nanoseconds over the
 * task's stores, added to the metrics once, so short writes are not each rounded down to 0 ms.
 */
private[streaming] final class StoreTimes {
  private var updateNanos = 0L
  private var removalNanos = 0L
  private var commitNanos = 0L

  private def timed[T](add: Long => Unit)(body: => T): T = {
    val start = System.nanoTime()
    try body finally add(System.nanoTime() - start)
  }
  def updating[T](body: => T): T = timed(updateNanos += _)(body)
  def removing[T](body: => T): T = timed(removalNanos += _)(body)
  def committing[T](body: => T): T = timed(commitNanos += _)(body)

  def addTo(metrics: StageMetrics): Unit = {
    import java.util.concurrent.TimeUnit.NANOSECONDS
    metrics.updatesTimeMs += NANOSECONDS.toMillis(updateNanos)
    metrics.removalsTimeMs += NANOSECONDS.toMillis(removalNanos)
    metrics.commitTimeMs += NANOSECONDS.toMillis(commitNanos)
  }
}
