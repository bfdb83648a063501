package umjoin.spark.streaming

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.analysis.StreamingJoinHelper
import org.apache.spark.sql.catalyst.expressions.{And, Attribute, AttributeSet, EqualTo, Expression, UnaryExpression}
import org.apache.spark.sql.catalyst.expressions.codegen.{CodegenContext, ExprCode}
import org.apache.spark.sql.catalyst.expressions.codegen.Block.BlockHelper
import org.apache.spark.sql.catalyst.expressions.codegen.FalseLiteral
import org.apache.spark.sql.catalyst.planning.ExtractEquiJoinKeys
import org.apache.spark.sql.catalyst.plans.Inner
import org.apache.spark.sql.catalyst.plans.logical.{Join, LogicalPlan}
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.types.{DataType, IntegerType, LongType, Metadata}
import org.apache.spark.unsafe.hash.Murmur3_x86_32

import umjoin.spark.UMJoinConf

/**
 * The join key of a stream-stream join without an equi-join key, over a side's event time `child`:
 * 0 for every row (NULL event times too), so a join on it pairs every row with every row and its
 * time range and other conditions decide. Spark's join keeps all its state in one partition; a
 * streaming UMJoin spreads a stream keyed by it over the partitions by time slice
 * ([[TimeSliceRing]]) and probes it in all of them. Never folded: the optimizer would turn an
 * equality of two constants into `true`.
 */
final case class TimeSlice(child: Expression) extends UnaryExpression {
  override def dataType: DataType = IntegerType
  override def nullable: Boolean = false
  override def foldable: Boolean = false
  override def prettyName: String = "umjoin_time_slice"
  override def eval(input: InternalRow): Any = 0
  override protected def doGenCode(ctx: CodegenContext, ev: ExprCode): ExprCode =
    ev.copy(code = code"final int ${ev.value} = 0;", isNull = FalseLiteral)
  override protected def withNewChildInternal(newChild: Expression): TimeSlice = copy(child = newChild)
}

/**
 * Where a stream's stored row is kept when its state is spread over the partitions by event time
 * (see [[StreamingLayout.timeSliceMs]]): its event time `child` falls in slice s (slices of
 * `widthMs` from the epoch), and slice s goes to partition s mod `partitions`, a ring, so that any
 * `partitions` consecutive slices are one in each partition. The value is a key that Spark's hash
 * partitioning (Murmur3, seed 42, into `partitions`) puts there: the smallest such key per
 * partition, found once. NULL for a NULL time.
 */
final case class TimeSliceRing(child: Expression, widthMs: Long, partitions: Int) extends UnaryExpression {
  require(widthMs > 0 && partitions > 0, "a time slice is at least 1 ms wide, over at least one partition")
  override def dataType: DataType = LongType
  override def prettyName: String = "umjoin_time_slice_ring"
  override def toString: String = s"$prettyName($child, $widthMs ms, $partitions partitions)"
  override def sql: String = s"$prettyName(${child.sql}, $widthMs, $partitions)"

  /** Per partition, a key Spark's hash partitioning puts in it. */
  @transient private lazy val keys: Array[Long] = {
    val found = Array.fill(partitions)(-1L)
    var key = 0L
    while (found.contains(-1L)) {
      val partition = Math.floorMod(Murmur3_x86_32.hashLong(key, TimeSliceRing.HashSeed), partitions)
      if (found(partition) < 0) found(partition) = key
      key += 1
    }
    found
  }

  override protected def nullSafeEval(time: Any): Any =
    keys(Math.floorMod(Math.floorDiv(time.asInstanceOf[Long], widthMs * 1000L), partitions.toLong).toInt)
  override protected def doGenCode(ctx: CodegenContext, ev: ExprCode): ExprCode = {
    val table = ctx.addReferenceObj("sliceKeys", keys, "long[]")
    defineCodeGen(ctx, ev, t => s"$table[(int) java.lang.Math.floorMod(java.lang.Math.floorDiv($t, ${widthMs * 1000L}L), ${partitions}L)]")
  }
  override protected def withNewChildInternal(newChild: Expression): TimeSliceRing = copy(child = newChild)
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
 * Lets an inner stream-stream join without an equality between its sides run (Spark refuses it
 * while planning: "Stream-stream join without equality predicate is not supported"): a join on a
 * time range, a band (`a.price BETWEEN b.low AND b.high`) or any other condition is given the key
 * `umjoin_time_slice(left time) = umjoin_time_slice(right time)` over each side's event-time column,
 * so Spark plans its stream-stream join, keyed by the slice, and a streaming UMJoin takes the
 * group (and spreads its state over the partitions by time slice: [[StreamingLayout.timeSliceMs]]).
 * Only where both sides' rows are evicted (each side's event time bounded by the other's in the
 * condition, both with watermarks): otherwise the state would grow forever, and the join is
 * refused with what is missing. An optimizer rule after Spark's operator optimizations (a pre-CBO
 * rule): those would fold the slice equality away.
 */
object WindowJoinSlices extends Rule[LogicalPlan] {
  override def apply(plan: LogicalPlan): LogicalPlan =
    if (!plan.isStreaming || !UMJoinConf.Enabled(key => Option(conf.getConfString(key, null)))) plan
    else plan.transformUp {
      case j @ Join(left, right, Inner, Some(condition), _) if left.isStreaming && right.isStreaming && ExtractEquiJoinKeys.unapply(j).isEmpty =>
        unbounded(left, right, condition).foreach(missing => throw refusal(condition, missing))
        val slices = EqualTo(TimeSlice.of(eventTimeColumn(left, condition).get), TimeSlice.of(eventTimeColumn(right, condition).get))
        j.copy(condition = Some(And(slices, condition)))
    }

  /** The side's event-time column the condition reads (the first one, if it reads several). */
  private def eventTimeColumn(side: LogicalPlan, condition: Expression) =
    StreamingWatermarks.eventTimeColumn(side.output.filter(condition.references.contains))

  /** What the join lacks for both sides' rows to be evicted, if anything. */
  private def unbounded(left: LogicalPlan, right: LogicalPlan, condition: Expression): Option[String] = {
    def evicted(side: LogicalPlan, other: LogicalPlan): Boolean =
      StreamingJoinHelper.getStateValueWatermark(AttributeSet(side.output), AttributeSet(other.output), Some(condition), Some(0L)).isDefined
    val sides = Seq((left, right, "left"), (right, left, "right"))
    sides.collectFirst {
      case (side, _, name) if StreamingWatermarks.eventTimeColumn(side.output).isEmpty =>
        s"its $name side has no event-time column with a watermark (withWatermark)"
    }.orElse(sides.collectFirst {
      case (side, other, name) if eventTimeColumn(side, condition).isEmpty || !evicted(side, other) =>
        s"its condition does not bound the $name side's event time by the other side's " +
          "(e.g. l.time BETWEEN r.time - INTERVAL 10 MINUTES AND r.time + INTERVAL 10 MINUTES), so its rows would be kept forever"
    })
  }

  private def refusal(condition: Expression, missing: String): UnsupportedOperationException =
    new UnsupportedOperationException(s"UMJoin cannot run the stream-stream join ON ${condition.sql}, which has no " +
      s"equality between its sides: $missing. Spark refuses such a join (\"Stream-stream join without equality predicate " +
      "is not supported\"); UMJoin runs it when both sides have watermarks and the condition bounds each side's event time by the other's.")
}
