package umjoin.spark.streaming

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration

import org.apache.spark.{Partitioner, ShuffleDependency, SparkContext, TaskContext}
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, BoundReference, Expression,
  UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter
import org.apache.spark.sql.execution.{ShuffledRowRDD, UnsafeRowSerializer}
import org.apache.spark.sql.execution.exchange.ShuffleExchangeExec
import org.apache.spark.sql.execution.metric.{SQLMetric, SQLShuffleReadMetricsReporter,
  SQLShuffleWriteMetricsReporter}
import org.apache.spark.sql.execution.streaming.state.StateStore
import org.apache.spark.unsafe.Platform

import org.apache.spark.sql.execution.umjoin.ShuffleWrites
import umjoin.spark.batch.UMJoinExec
import umjoin.spark.core.cost.ProbeCounters
import umjoin.spark.core.probe.{CompiledRoute, ProbeCore, Route, StreamPadding}
import umjoin.spark.core.store.JoinStore

/**
 * One task of one stage of a micro-batch (see [[StreamingUMJoinExec]]). Stage 0 starts the routes
 * from the batch's new rows of every stream, stage s > 0 continues the partial combinations stage
 * s - 1 shipped to this partition; each runs its routes' steps until a step needs another
 * partition, then ships the combination there ([[ShipAddresses]]: to one partition, or all). The
 * last stage writes the batch's new rows into the stores, evicts what can no longer join, and
 * commits. Outer joins' padded combinations are rescanned from the stored rows when due
 * ([[OuterPadding]]); semi joins' waiting combinations are settled by [[SemiJoinSettling]].
 *
 * Stores are read as the previous batch committed them ([[StageStores]]); this batch's new rows of
 * an input are indexed in memory from the input's partition and seen by routes that start at a
 * later input. `committed` reports the stores the last stage committed (the operator's state
 * metrics).
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
    committed: (Seq[StateStore], Long) => Unit) {

  private val partition = context.partitionId()
  private val isLast = stage == job.stageCount - 1
  private val counters = statistics.map(_ => new ProbeCounters(job.layout.kinds.size))
  private val stores = new StageStores(job, stage, context, read, broadcastRows, metrics,
    storeConfs, hadoopConf, counters)
  import stores.{fresh, inMemory, indexInMemory, seesNewRows, stateOf, storeFor}

  // The semi joins' waiting combinations, and the semi joins this stage settles.
  private val settling = new SemiJoinSettling(job, stage, partition, metrics,
    (input, index) => stateOf(input).storeFor(index),
    (input, index) => indexInMemory(input, fresh(input, None), Seq(index))(index),
    new PartitionStores(StoreLayout.Separate, job.info, partition, storeConfs, hadoopConf, context),
    storeConfs)

  /** This stage's part of each route, ready to run (compiled when first used). */
  private val cores = mutable.Map[Shipped.Partial, (Route.Segment, ProbeCore)]()
  private def coreOf(partial: Shipped.Partial): (Route.Segment, ProbeCore) =
      cores.getOrElseUpdate(partial, {
    val run = job.planOf(partial)
    val segment = run.segments(stage)
    val rescan = partial.isInstanceOf[Shipped.Rescan]
    // An outer step pads where no row of its input there is matches: the route binds the stored
    // ones (and the new ones, where it sees them), so the new ones are checked where it does not.
    val padding = job.padding.map(p => StreamPadding(
      (input, index) => if (seesNewRows(partial, input)) null else inMemory(input, index),
      p.now.get, Option.when(rescan)(p.rescanned(partial.start)),
      Option.when(rescan)(p.due(partial.start))))
    val compiled = CompiledRoute.segment(run, segment.from, segment.until, job.outputs, job.result,
      (input, index) => storeFor(partial, input, index), identity, metrics.inputs, partition,
      Option.when(job.unmatched.nonEmpty) {
        (semi: Int, bound: Seq[Attribute]) =>
          val inInputOrder = UnsafeProjection.create(
            job.unmatched.find(_.nonPreserved == semi).get.spec.output, bound)
          (combination: InternalRow) => settling.waitFor(semi, inInputOrder(combination).copy())
      }, padding)
    (segment, new ProbeCore(compiled,
      Option.when(stage == 0 && !rescan)(metrics.inputs(run.start).rowsIn),
      Option.when(segment.next.isEmpty)(metrics.numOutputRows), context, counters))
  })

  /** Rows this stage produces, each with what it is. */
  private def produced(): Iterator[(Shipped, InternalRow)] = {
    def label(partial: Shipped.Partial, rows: Iterator[InternalRow],
        segment: Route.Segment): Iterator[(Shipped, InternalRow)] =
      rows.map(row => (if (segment.next.isEmpty) Shipped.Result else partial, row))
    if (stage == 0) {
      val routes = job.layout.streams.iterator.filter(job.routes.contains).flatMap { start =>
        val partial = Shipped.NewRows(start)
        val (segment, core) = coreOf(partial)
        label(partial, core.join(fresh(start, None)), segment)
      }
      // The combinations of stored rows only that become due padded now: rescanned from the stored
      // rows of the streams the joins' watermarks read.
      val rescans = job.padding.iterator.flatMap(_.rescanStarts).flatMap { start =>
        val rescan = Shipped.Rescan(start)
        val (segment, core) = coreOf(rescan)
        label(rescan, core.join(stateOf(start).visibleRows()), segment)
      }
      routes ++ rescans
    } else {
      val feeds = mutable.Map[Shipped.Partial,
        (Route.Segment, StageTask.Feed, Iterator[InternalRow])]()
      val resultRow = new UnsafeRow(job.result.size)
      // (Every semi join's waiting combinations have the same columns: its preserved side is every
      // input that binds rows.)
      val unmatchedRow =
        new UnsafeRow(job.unmatched.headOption.map(_.spec.output.size).getOrElse(0))
      // With time-sliced stores, the shuffle's reading of each combination is timed (its part of
      // T_s).
      val arriving = metrics.sliceCosts.fold(shipped()) { costs =>
        new StageTask.TimedWithin[InternalRow](shipped(), costs.shipNanos,
          row => job.shippedTags.isPartial(row.getInt(0)))
      }
      arriving.flatMap { shippedRow =>
        val envelope = shippedRow.asInstanceOf[UnsafeRow]
        job.shippedTags.of(envelope.getInt(0)) match {
          case waiting: Shipped.Waiting =>
            StageTask.pointToContent(unmatchedRow, envelope)
            Iterator.single((waiting, unmatchedRow))
          case Shipped.Result =>
            StageTask.pointToContent(resultRow, envelope)
            Iterator.single((Shipped.Result, resultRow))
          case partial: Shipped.Partial =>
            val (segment, feed, rows) = feeds.getOrElseUpdate(partial, {
              val (segment, core) = coreOf(partial)
              val feed = new StageTask.Feed(
                job.boundBy(partial, segment.from + 1).map(job.outputs(_).size).sum)
              // Probing a time-sliced store is timed (T_j, with the rows its conditions test).
              val probing = job.planOf(partial).steps(segment.from).input
              val probeNanos = metrics.sliceCosts.flatMap(_.probeNanos.get(probing))
              (segment, feed, probeNanos.fold(core.join(feed))(nanos =>
                new StageTask.TimedWithin(core.join(feed), nanos, (_: InternalRow) => true)))
            })
            feed.set(envelope)
            label(partial, rows, segment)
        }
      }
    }
  }

  /** A stage before the last: its rows, each addressed to the partition it continues in. */
  def shipping(): Iterator[(Int, InternalRow)] = {
    val envelope = new UnsafeRowWriter(2)
    val copied = ShuffleWrites.keepRows(job.info.numPartitions)
    // The envelope: the row's tag, then its bytes, copied once, from where they are.
    def wrap(what: Shipped, row: InternalRow): UnsafeRow = {
      val bytes = row.asInstanceOf[UnsafeRow]
      envelope.reset()
      envelope.zeroOutNullBytes()
      envelope.write(0, job.shippedTags.tag(what))
      bytes.getBaseObject match {
        case array: Array[Byte] =>
          envelope.write(1, array, (bytes.getBaseOffset - Platform.BYTE_ARRAY_OFFSET).toInt,
            bytes.getSizeInBytes)
        case _ => envelope.write(1, bytes.getBytes)
      }
      if (copied) envelope.getRow.copy() else envelope.getRow
    }
    val addresses = new ShipAddresses(job)
    val all = 0 until job.info.numPartitions
    // Unmatched combinations stay in this partition (their non-preserved input's store's) until the
    // stage that settles them.
    val unmatched = () => settling.settledLater.map { case (semi, row) =>
      (partition, wrap(Shipped.Unmatched(semi), row)) }
    // The semi joins settled here: their result rows go on to the last stage, the combinations they
    // let through to the next semi join's partition.
    val settled = () => if (!settling.settlesAny) Iterator.empty else {
      val (results, onward) = settling.settle()
      settling.commit()
      committed(settling.instances, settling.rowsKept)
      results.iterator.map(row => (partition, wrap(Shipped.Result, row))) ++
        onward.iterator.map { case (k, combination) =>
          val semi = job.unmatched(k)
          (addresses.ofSemi(semi)(combination).getInt(0),
            wrap(Shipped.PassedOn(semi.nonPreserved), combination))
        }
    }
    val addressed = StageTask.whenDone(produced().flatMap {
      case (waiting: Shipped.Waiting, row) if settling.settlesHere(waiting) =>
        settling.keep(waiting, row)
        Iterator.empty
      // A result row or a waiting combination stays in this partition (one goes on only to the last
      // stage).
      case (staying @ (Shipped.Result | _: Shipped.Waiting), row) =>
        Iterator.single((partition, wrap(staying, row)))
      case (partial: Shipped.Partial, row) =>
        val segment = job.planOf(partial).segments(stage)
        segment.next match {
          case Some(Route.Reach.ByKey(keyClass)) =>
            metrics.shipped += 1
            Iterator.single((addresses.byKey(partial, segment, keyClass)(row).getInt(0),
              wrap(partial, row)))
          case _ =>
            val wrapped = wrap(partial, row)
            val targets = addresses.bySlice(partial, segment).fold(all.iterator) {
              case (input, window, times) =>
                metrics.sliceCosts.foreach(_.combinations(input) += 1)
                window.partitionsFor(times(row))
            }
            targets.map { p =>
              metrics.shipped += 1
              (p, wrapped)
            }
        }
    } ++ settled() ++ unmatched(), () => report())
    // With time-sliced stores, the shuffle's writing of each combination is timed (its part of
    // T_s).
    metrics.sliceCosts.fold(addressed) { costs =>
      new StageTask.TimedOutside[(Int, UnsafeRow)](addressed, costs.shipNanos,
        { case (_, row) => job.shippedTags.isPartial(row.getInt(0)) })
    }
  }

  /**
   * The last stage: result rows, then the semi joins' combinations matched at last; once they are
   * all out, the batch's new rows are stored and every store is committed.
   */
  def results(): Iterator[InternalRow] = {
    val rows = produced().flatMap {
      case (waiting: Shipped.Waiting, row) =>
        if (!settling.settlesHere(waiting)) {
          throw new IllegalStateException(
            "UMJoin: a semi join's waiting combination reached the last stage, " +
              "which does not settle it")
        }
        settling.keep(waiting, row)
        Iterator.empty
      case (_, row) => Iterator.single(row)
    }
    // (The last stage settles the last semi joins: nothing goes on past them.)
    StageTask.whenDone(
      rows ++ (if (!settling.settlesAny) Iterator.empty else settling.settle()._1.iterator),
      () => finish())
  }

  private def finish(): Unit = {
    stores.writeAndCommit(job.layout.stored)
    stores.storeTimes.committing(settling.commit())
    stores.storeTimes.addTo(metrics)
    committed(stores.instances ++ settling.instances, stores.rowsKept + settling.rowsKept)
    report()
  }

  private def report(): Unit = statistics.foreach(accumulator => counters.foreach(accumulator.add))
}

private[streaming] object StageTask {

  /**
   * Points `row` at the row a shipped envelope holds, in the envelope's own buffer: valid until the
   * next envelope is read, as every row of a shuffle's reader (no copy of its bytes).
   */
  def pointToContent(row: UnsafeRow, envelope: UnsafeRow): Unit = {
    val offsetAndSize = envelope.getLong(1)
    row.pointTo(envelope.getBaseObject, envelope.getBaseOffset + (offsetAndSize >>> 32),
      offsetAndSize.toInt)
  }

  /**
   * The partial combinations of one route arriving at a task, one at a time, as the probe loop's
   * input.
   */
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

  /**
   * An in-memory index keyed as [[UMJoinExec.hashable]] keys it, probed with keys of the classes'
   * own types.
   */
  def keyedAsBuilt(store: JoinStore, keys: Seq[Expression]): JoinStore =
    if (UMJoinExec.hashable(keys) == keys) store
    else new JoinStore {
      private val widen = UnsafeProjection.create(UMJoinExec.hashable(
        keys.zipWithIndex.map { case (k, i) => BoundReference(i, k.dataType, nullable = false) }))
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
  final class TimedWithin[T](rows: Iterator[T], nanos: SQLMetric,
      counted: T => Boolean) extends Iterator[T] {
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
  final class TimedOutside[T](rows: Iterator[T], nanos: SQLMetric,
      counted: T => Boolean) extends Iterator[T] {
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

/**
 * The shuffle of partial combinations between two stages (rows of `fields` fields: 2, a tag and
 * the combination), or of any rows of one width: each row goes to the partition it is addressed
 * to.
 */
object ComboShuffle {
  def apply(mapSide: RDD[(Int, InternalRow)], partitions: Int, sc: SparkContext,
      fields: Int = 2): RDD[InternalRow] = {
    val writeMetrics = SQLShuffleWriteMetricsReporter.createShuffleWriteMetrics(sc)
    val dependency = new ShuffleDependency[Int, InternalRow, InternalRow](mapSide,
      new AddressedPartitioner(partitions), new UnsafeRowSerializer(fields),
      shuffleWriterProcessor = ShuffleExchangeExec.createShuffleWriteProcessor(writeMetrics))
    new ShuffledRowRDD(dependency, SQLShuffleReadMetricsReporter.createShuffleReadMetrics(sc))
  }

  private final class AddressedPartitioner(override val numPartitions: Int) extends Partitioner {
    override def getPartition(key: Any): Int = key.asInstanceOf[Int]
  }
}
