package umjoin.spark.streaming

import org.apache.spark.util.AccumulatorV2

/**
 * Event times from `fromMicros` on cut into slices of `widthMs`, numbered from `firstSlice` (a
 * stretch of a [[TimeSlicing]]; the first one reaches back, the last one ahead, without end).
 */
final case class SliceStretch(fromMicros: Long, widthMs: Long, firstSlice: Long) {
  require(widthMs > 0, "a time slice is at least 1 ms wide")
  def widthMicros: Long = widthMs * 1000L
  def sliceOf(micros: Long): Long = firstSlice + Math.floorDiv(micros - fromMicros, widthMicros)
}

/**
 * How a stream's rows are spread by time slice: the event times a row can join across (its span:
 * the widest range, before and after it, the conditions let another stream's rows be in) are cut
 * into `slices` slices, and slice s of the event times is kept in partition s mod n of the n state
 * partitions (a ring: any n consecutive slices are one in each partition). The slices are numbered
 * along `stretches`, each from an event time on with its own width: a new width (another count)
 * starts at a slice boundary past every stored row's event time (PSP's passive state
 * relocation, paper 004), so every stored row stays where it was placed and is found there, and no
 * row moves. A stretch goes once no stored row is older than the next one's start.
 *
 * `earlierWidthsMs`: only in checkpoints of versions before stretches, rows placed by slices of
 * these widths from the epoch, still probed where they are until none is left ([[SliceDrain]]).
 */
final case class TimeSlicing(slices: Int, stretches: Seq[SliceStretch],
    earlierWidthsMs: Seq[Long]) {
  require(stretches.nonEmpty &&
    stretches.zip(stretches.tail).forall { case (a, b) => a.fromMicros < b.fromMicros })

  /** The width of the slices new event times fall in. */
  def widthMs: Long = stretches.last.widthMs

  /**
   * The number of the slice event time `micros` falls in; numbers grow with the time, one per
   * slice.
   */
  def sliceOf(micros: Long): Long =
    stretches.findLast(_.fromMicros <= micros).getOrElse(stretches.head).sliceOf(micros)

  /**
   * The partition a row of event time `micros` is kept in (the generated code of [[TimeSliceRing]]
   * computes the same).
   */
  def partitionOf(micros: Long, partitions: Int): Int =
    Math.floorMod(sliceOf(micros), partitions.toLong).toInt

  /**
   * This slicing with `slices` slices of `widthMs` for the event times after `stored`'s (the
   * stored rows' event times: None when no row is stored), from the first slice boundary past
   * them; stretches no stored row falls in any more are dropped.
   */
  def recut(slices: Int, widthMs: Long, stored: Option[(Long, Long)]): TimeSlicing = stored match {
    case None => TimeSlicing(slices, Seq(SliceStretch(stretches.last.fromMicros, widthMs,
      stretches.last.firstSlice)), earlierWidthsMs)
    case Some((oldest, newest)) =>
      val kept = stretches.drop(stretches.lastIndexWhere(_.fromMicros <= oldest).max(0))
      val last = kept.last
      val next = Math.floorDiv(newest - last.fromMicros, last.widthMicros) + 1
      val cut =
        if (widthMs == last.widthMs) kept
        // (no stored row in the last stretch)
        else if (next <= 0) kept.init :+ last.copy(widthMs = widthMs)
        else kept :+ SliceStretch(last.fromMicros + next * last.widthMicros, widthMs,
          last.firstSlice + next)
      TimeSlicing(slices, cut, earlierWidthsMs)
  }
}

object TimeSlicing {
  /**
   * `slices` slices per `spanMs`, from the epoch (a new store's slicing, and every one recorded
   * before stretches).
   */
  def apply(slices: Int, widthMs: Long): TimeSlicing =
    TimeSlicing(slices, Seq(SliceStretch(0L, widthMs, 0L)), Nil)

  def width(spanMs: Long, slices: Int): Long = (spanMs / slices.max(1)).max(1L)

  /**
   * The width of `slices` slices per `spanMs` for the event times to come, balanced by rows (PSP
   * paper 004, 5.5 and 6: the slices' rows, not their time, even): as many rows per slice as the
   * stored rows give span / slices, at the rate the last micro-batch's rows came. At a steady rate
   * that is span / slices; at k times the stored rows' rate, 1/k of it (at most the span, at least
   * 1 ms). The current width stays (`keptMs`, where the count stays) while within a factor of 2 of
   * it: rates measured over one micro-batch vary.
   */
  def balancedWidth(spanMs: Long, slices: Int, rows: SlicedRows, keptMs: Option[Long]): Long = {
    val steady = width(spanMs, slices)
    val balanced = (for (stored <- rows.stored.ratePerMs; arrived <- rows.arrived.ratePerMs)
      yield math.round(steady * stored / arrived).max(1L).min(spanMs.max(1L))).getOrElse(steady)
    keptMs.filter(kept => kept <= 2 * balanced && balanced <= 2 * kept).getOrElse(balanced)
  }
}

/**
 * Event times of some rows of a sliced stream: their count, the least and the greatest (None: no
 * row).
 */
final case class EventTimes(rows: Long, range: Option[(Long, Long)]) {
  def union(other: EventTimes): EventTimes =
    EventTimes(rows + other.rows, (range ++ other.range).reduceOption[(Long, Long)] {
      case ((lowA, highA), (lowB, highB)) => (math.min(lowA, lowB), math.max(highA, highB))
    })

  /**
   * Rows per ms of event time: the count less one over the range (unbiased for rows spread evenly);
   * None for fewer than [[EventTimes.RateRows]] rows or one time.
   */
  def ratePerMs: Option[Double] =
    range.collect { case (low, high) if rows >= EventTimes.RateRows && high > low =>
      (rows - 1) * 1000.0 / (high - low)
    }
}

object EventTimes {
  val Empty: EventTimes = EventTimes(0L, None)

  /** The fewest rows a rate is measured from: from n rows it is off by about 1/sqrt(n). */
  val RateRows = 20

  /** Counts the event times a task sees, row by row (no object per row). */
  final class Counter {
    private var rows = 0L
    private var low = Long.MaxValue
    private var high = Long.MinValue
    def add(micros: Long): Unit = {
      rows += 1
      low = math.min(low, micros)
      high = math.max(high, micros)
    }
    def times: EventTimes = EventTimes(rows, Option.when(rows > 0)((low, high)))
  }
}

/**
 * What a micro-batch's tasks reported of a sliced stream's rows: the partitions that reported, the
 * event times of the rows stored after the batch, and of those among them it brought. The counts
 * are a measure only: a task run again adds its rows again.
 */
final case class SlicedRows(partitions: Set[Int], stored: EventTimes, arrived: EventTimes) {
  def union(other: SlicedRows): SlicedRows = SlicedRows(partitions ++ other.partitions,
    stored.union(other.stored), arrived.union(other.arrived))
}

object SlicedRows {
  val Empty: SlicedRows = SlicedRows(Set.empty, EventTimes.Empty, EventTimes.Empty)
}

/** Collects [[SlicedRows]] from a micro-batch's tasks. */
final class SlicedRowsAccumulator extends AccumulatorV2[SlicedRows, SlicedRows] {
  private var rows = SlicedRows.Empty
  override def isZero: Boolean = rows == SlicedRows.Empty
  override def copy(): SlicedRowsAccumulator = {
    val other = new SlicedRowsAccumulator
    other.rows = rows
    other
  }
  override def reset(): Unit = rows = SlicedRows.Empty
  override def add(v: SlicedRows): Unit = rows = rows.union(v)
  override def merge(other: AccumulatorV2[SlicedRows, SlicedRows]): Unit = add(other.value)
  override def value: SlicedRows = rows
}
