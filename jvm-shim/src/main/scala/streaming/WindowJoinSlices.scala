package umjoin.spark.streaming

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.analysis.StreamingJoinHelper
import org.apache.spark.sql.catalyst.expressions.{And, Attribute, AttributeSet, EqualTo, Expression,
  UnaryExpression}
import org.apache.spark.sql.catalyst.expressions.codegen.{CodegenContext, ExprCode}
import org.apache.spark.sql.catalyst.planning.ExtractEquiJoinKeys
import org.apache.spark.sql.catalyst.plans.{FullOuter, Inner, JoinType, LeftOuter,
  LeftSemi, RightOuter}
import org.apache.spark.sql.catalyst.plans.logical.{Join, LogicalPlan}
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.types.{DataType, IntegerType, LongType, Metadata, TimestampNTZType,
  TimestampType}
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.unsafe.hash.Murmur3_x86_32
import org.apache.spark.util.LongAccumulator

import umjoin.spark.UMJoinConf

/**
 * The join key of a stream-stream join without an equi-join key, over a side's event time `child`:
 * 0 for every row, so a join on it pairs every row with every row and its time range and other
 * conditions decide. NULL for a NULL event time, which no time range matches: an outer join's
 * padded side has a NULL key, as for an equi-join key. Spark's join keeps all its state in one
 * partition; a streaming UMJoin spreads a stream keyed by it over the partitions by time slice
 * ([[TimeSliceRing]]) and probes it in all of them. Never folded: the optimizer would turn an
 * equality of two constants into `true`.
 */
final case class TimeSlice(child: Expression) extends UnaryExpression {
  override def dataType: DataType = IntegerType
  override def foldable: Boolean = false
  override def prettyName: String = "umjoin_time_slice"
  override protected def nullSafeEval(time: Any): Any = 0
  override protected def doGenCode(ctx: CodegenContext, ev: ExprCode): ExprCode =
    defineCodeGen(ctx, ev, _ => "0")
  override protected def withNewChildInternal(newChild: Expression): TimeSlice =
    copy(child = newChild)
}

/**
 * Where a stream's stored row is kept when its state is spread over the partitions by event time
 * (see [[StreamingLayout.timeSlices]]): its event time `child` falls in a slice of `slicing`, and
 * slice s goes to partition s mod `partitions`, a ring, so that any `partitions` consecutive slices
 * are one in each partition. The value is a key that Spark's hash partitioning (Murmur3, seed 42,
 * into `partitions`) puts there: the smallest such key per partition, found once. NULL for a NULL
 * time.
 */
final case class TimeSliceRing(child: Expression, slicing: TimeSlicing, partitions: Int)
  extends UnaryExpression {
  require(partitions > 0, "time slices are spread over at least one partition")
  override def dataType: DataType = LongType
  override def prettyName: String = "umjoin_time_slice_ring"
  // The first stretch reaches back without end; the others start at an event time (UTC).
  private def stretchesText =
    (s"${slicing.stretches.head.widthMs} ms" +: slicing.stretches.tail.map { s =>
      s"${s.widthMs} ms from " +
        s"${java.time.Instant.EPOCH.plus(s.fromMicros, java.time.temporal.ChronoUnit.MICROS)}"
    }).mkString(", ")
  override def toString: String = s"$prettyName($child, $stretchesText, $partitions partitions)"
  override def sql: String = s"$prettyName(${child.sql}, '$stretchesText', $partitions)"

  /** Per partition, a key Spark's hash partitioning puts in it. */
  @transient private lazy val keys: Array[Long] = {
    val found = Array.fill(partitions)(-1L)
    var key = 0L
    while (found.contains(-1L)) {
      val partition =
        Math.floorMod(Murmur3_x86_32.hashLong(key, TimeSliceRing.HashSeed), partitions)
      if (found(partition) < 0) found(partition) = key
      key += 1
    }
    found
  }

  override protected def nullSafeEval(time: Any): Any =
    keys(slicing.partitionOf(time.asInstanceOf[Long], partitions))
  override protected def doGenCode(ctx: CodegenContext, ev: ExprCode): ExprCode = {
    val table = ctx.addReferenceObj("sliceKeys", keys, "long[]")
    // TimeSlicing.sliceOf: the last stretch starting at or before the time, else the first one.
    def slice(t: String, s: SliceStretch) =
      s"(${s.firstSlice}L + java.lang.Math.floorDiv($t - ${s.fromMicros}L, ${s.widthMicros}L))"
    defineCodeGen(ctx, ev, { t =>
      val later = slicing.stretches.tail.reverse.map(s =>
        s"$t >= ${s.fromMicros}L ? ${slice(t, s)} : ").mkString
      s"$table[(int) java.lang.Math.floorMod($later${slice(t, slicing.stretches.head)}, " +
        s"${partitions}L)]"
    })
  }
  override protected def withNewChildInternal(newChild: Expression): TimeSliceRing =
    copy(child = newChild)
}

/**
 * Which partitions can hold the rows of a time-sliced store (placed by `slicing`, see
 * [[TimeSliceRing]]; on a ring of `partitions`) that a partial combination can still join: the
 * store's input's event time t must be within `bounds` of every bound stream's, t_m - behind <= t
 * <= t_m + ahead (the bounds the conditions put between the two event times, along any chain of
 * streams: a row outside them completes no result), so only the slices that range overlaps are
 * probed (PSP paper 004: a probe visits the slices its window overlaps). One millisecond more on
 * each side: Spark's bounds are in milliseconds, event times in microseconds.
 */
final case class SliceWindow(slicing: TimeSlicing, partitions: Int,
    bounds: Seq[SliceWindow.Bound]) {
  private val earlierWidthsMicros = slicing.earlierWidthsMs.map(_ * 1000L).toArray

  /** The partition a row of event time `micros` is placed in now. */
  def placement(micros: Long): Int = slicing.partitionOf(micros, partitions)

  /**
   * The partitions to probe for a combination whose bound streams' event times (microseconds,
   * in the order of `bounds`) are `times`; every partition where one is NULL.
   */
  def partitionsFor(times: InternalRow): Iterator[Int] = {
    var low = Long.MinValue
    var high = Long.MaxValue
    var i = 0
    while (i < bounds.size) {
      if (times.isNullAt(i)) return Iterator.range(0, partitions)
      val t = times.getLong(i)
      low = math.max(low, t - (bounds(i).behindMs + 1) * 1000L)
      high = math.min(high, t + (bounds(i).aheadMs + 1) * 1000L)
      i += 1
    }
    if (low == Long.MinValue || high == Long.MaxValue) Iterator.range(0, partitions)
    else if (low > high) Iterator.empty
    else {
      val probed = new java.util.BitSet(partitions)
      def probe(first: Long, last: Long): Unit =
        if (last - first + 1 >= partitions) probed.set(0, partitions)
        else (first to last).foreach(s => probed.set(Math.floorMod(s, partitions.toLong).toInt))
      probe(slicing.sliceOf(low), slicing.sliceOf(high))
      earlierWidthsMicros.foreach(width =>
        probe(Math.floorDiv(low, width), Math.floorDiv(high, width)))
      Iterator.iterate(probed.nextSetBit(0))(p => probed.nextSetBit(p + 1)).takeWhile(_ >= 0)
    }
  }
}

/**
 * What a micro-batch counted of a stream's rows placed by an earlier slicing (`earlierWidthsMs` of
 * a [[TimeSlicing]] recorded by a version before stretches):
 * the partitions that counted (`partitionsCounted`) and the rows not in the partition the current
 * slicing puts their event time in (`earlierPlaced`). Once a batch counted none in every partition,
 * the next one probes by the current slicing alone.
 */
final case class SliceDrain(storeVersion: Long, partitionsCounted: LongAccumulator,
    earlierPlaced: SQLMetric) {
  /** Whether the batch before the one of `version` found no such row in any of the `partitions`. */
  def drainedBefore(version: Long, partitions: Int): Boolean =
    storeVersion == version - 1 && partitionsCounted.value == partitions && earlierPlaced.value == 0
}

object SliceWindow {
  /** Event times slices are cut in: microseconds (a window's struct is not sliced). */
  def isTimestamp(t: DataType): Boolean = t == TimestampType || t == TimestampNTZType

  /**
   * Stream `input`'s event-time column `time`, and how far the sliced input's event time may be
   * behind and ahead of it (ms).
   */
  final case class Bound(input: Int, time: Attribute, behindMs: Long, aheadMs: Long)
}

object TimeSliceRing {
  /** The seed of the Murmur3 hash Spark's HashPartitioning places rows by. */
  val HashSeed = 42
}

object TimeSlice {
  /**
   * The slice of `time`, the event-time column read without its watermark's mark: a key over a
   * marked column is a watermark on the key for Spark's stream-stream join (its rows evicted once
   * the key is at or below the watermark), and a slice is not an event time.
   */
  def of(time: Attribute): TimeSlice = TimeSlice(time.withMetadata(Metadata.empty))
}

/**
 * Lets a stream-stream join without an equality between its sides run (Spark refuses it while
 * planning: "Stream-stream join without equality predicate is not supported"), inner, outer or
 * left semi (the types Spark runs between streams given an equi-join key): a join on a
 * time range, a band (`a.price BETWEEN b.low AND b.high`) or any other condition is given the key
 * `umjoin_time_slice(left time) = umjoin_time_slice(right time)` over each side's event-time
 * column, so Spark plans its stream-stream join, keyed by the slice, and a streaming UMJoin takes
 * the group (and spreads its state over the partitions by time slice:
 * [[StreamingLayout.timeSlices]]). Only where both sides' rows are evicted (each side's event time
 * bounded by the other's in the condition, both with watermarks): otherwise the state would grow
 * forever, and the join is refused with what is missing. An optimizer rule after Spark's operator
 * optimizations (a pre-CBO rule): those would fold the slice equality away.
 */
object WindowJoinSlices extends Rule[LogicalPlan] {
  override def apply(plan: LogicalPlan): LogicalPlan =
    if (!plan.isStreaming || !UMJoinConf.Enabled(key => Option(conf.getConfString(key, null)))) plan
    else plan.transformUp {
      case j @ Join(left, right, joinType, Some(condition), _)
          if Sliceable(joinType) && left.isStreaming && right.isStreaming &&
            ExtractEquiJoinKeys.unapply(j).isEmpty =>
        unbounded(left, right, condition).foreach(missing => throw refusal(condition, missing))
        val slices = EqualTo(TimeSlice.of(eventTimeColumn(left, condition).get),
          TimeSlice.of(eventTimeColumn(right, condition).get))
        j.copy(condition = Some(And(slices, condition)))
    }

  /**
   * The join types Spark runs between two streams, given an equi-join key (a left anti join it does
   * not run at all).
   */
  private val Sliceable: Set[JoinType] = Set(Inner, LeftOuter, RightOuter, FullOuter, LeftSemi)

  /** The side's event-time column the condition reads (the first one, if it reads several). */
  private def eventTimeColumn(side: LogicalPlan, condition: Expression) =
    StreamingWatermarks.eventTimeColumn(side.output.filter(condition.references.contains))

  /** What the join lacks for both sides' rows to be evicted, if anything. */
  private def unbounded(left: LogicalPlan, right: LogicalPlan,
      condition: Expression): Option[String] = {
    def evicted(side: LogicalPlan, other: LogicalPlan): Boolean =
      StreamingJoinHelper.getStateValueWatermark(AttributeSet(side.output),
        AttributeSet(other.output), Some(condition), Some(0L)).isDefined
    val sides = Seq((left, right, "left"), (right, left, "right"))
    sides.collectFirst {
      case (side, _, name) if StreamingWatermarks.eventTimeColumn(side.output).isEmpty =>
        s"its $name side has no event-time column with a watermark (withWatermark)"
    }.orElse(sides.collectFirst {
      case (side, other, name) if eventTimeColumn(side, condition).isEmpty ||
          !evicted(side, other) =>
        s"its condition does not bound the $name side's event time by the other side's " +
          ("(e.g. l.time BETWEEN r.time - INTERVAL 10 MINUTES AND r.time + INTERVAL 10 " +
            "MINUTES), so its rows would be kept forever")
    })
  }

  private def refusal(condition: Expression, missing: String): UnsupportedOperationException =
    new UnsupportedOperationException(
      s"UMJoin cannot run the stream-stream join ON ${condition.sql}, which has no " +
        s"equality between its sides: $missing" +
        ". Spark refuses such a join (\"Stream-stream join without equality predicate " +
        ("is not supported\"); UMJoin runs it when both sides have watermarks and the " +
          "condition bounds each side's event time by the other's."))
}
