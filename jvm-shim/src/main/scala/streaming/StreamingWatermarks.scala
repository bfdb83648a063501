package umjoin.spark.streaming

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.analysis.StreamingJoinHelper
import org.apache.spark.sql.catalyst.expressions.{Alias, And, Attribute, AttributeSet, Coalesce,
  Expression, GetStructField, LeafExpression, LessThanOrEqual, Literal, Not, Or, PredicateHelper}
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenFallback
import org.apache.spark.sql.catalyst.plans.logical.EventTimeWatermark
import org.apache.spark.sql.execution.streaming.operators.stateful.WatermarkSupport
import org.apache.spark.sql.types.{DataType, LongType, StructType}

import umjoin.spark.core.KeyClass

/**
 * The late-row filter Spark's stream-stream join `name` (operator and side) applies to one of its
 * sides: rows whose event time `time` (the side's event-time column, as an expression over the
 * group's inputs) is at or below the join's late-events watermark are dropped. `streams` are the
 * group's streams below that side. Over one stream's columns it decides at arrival; over a
 * partial combination (several streams, or columns of a static table too) Spark decides in the
 * micro-batch that combination was formed, the arrival of its last row; see
 * [[StreamingWatermarks]].
 */
final case class SideLateFilter(name: String, streams: Seq[Int], time: Expression,
    watermarkMs: Option[Long]) {
  def atArrival(inputOutputs: Seq[Seq[Attribute]]): Boolean =
    streams.size == 1 && time.references.subsetOf(AttributeSet(inputOutputs(streams.head)))
}

/**
 * A micro-batch's watermark in µs (NULL before there is one), as a value of the plan. A literal
 * would be written into the stage's generated code, new code to compile in every batch; this is
 * read from the code's references, so the code, and the class Spark caches for it, stay the same.
 */
final case class BatchWatermark(micros: Option[Long]) extends LeafExpression with CodegenFallback {
  override def dataType: DataType = LongType
  override def nullable: Boolean = micros.isEmpty
  override def eval(input: InternalRow): Any = micros.fold(null: Any)(identity)
  override def toString: String = micros.fold("null")(_.toString)
}

/**
 * Per pair of inputs (i)(m), the bound on m's event time minus i's (ms), if the group's conditions
 * bound it: see [[StreamingWatermarks.timeDistances]].
 */
final case class TimeDistances(bounds: IndexedSeq[IndexedSeq[Option[Long]]]) {
  def apply(i: Int): IndexedSeq[Option[Long]] = bounds(i)
}

/**
 * Event-time watermarks for a streaming UMJoin's inputs.
 *
 * Late rows: Spark drops late rows at every join of its binary tree, on both sides, with that
 * join's watermark: a leaf's rows, and the intermediate rows of a subtree. A filter over one
 * stream's rows drops them before they join or are stored. A filter over a subtree of several
 * streams applies to the partial combination of that subtree, in the micro-batch it was formed:
 * when its last row arrived. Watermarks never go back, so the join's watermark in that micro-batch
 * is the highest of its watermarks when each of the subtree's rows arrived; each stored row of
 * those streams keeps the join's watermark at its arrival (a "mark" column), and the combination
 * passes when its event time is above every mark (a residual condition of the group, checked as
 * soon as the subtree's inputs are bound). With no intermediate rows kept, this is the one place
 * the binary tree's answer could differ from UMJoin's: a combination completed by a row arriving
 * now, whose subtree Spark dropped as late micro-batches ago.
 *
 * Eviction: a stored row of input i can go once no future row of any other stream can complete a
 * result with it (a static table's rows do not arrive; they join the stream rows of each batch).
 * Spark's binary tree may evict a leaf's rows earlier because it keeps their intermediate results
 * in the upper joins' state; UMJoin keeps none, so it evicts row r of input i only when, for every
 * other input m, a bound rules out every future row of m (whose event time passes the watermark W):
 * a join key class shared with m's event-time column (r's key at or below W), or time-range
 * conditions linking i to m, directly or through other inputs. Spark's own analysis
 * (StreamingJoinHelper.getStateValueWatermark) gives each direct bound d(i, m) on m.time - i.time;
 * bounds add up along paths (shortest paths over the inputs), and r goes when r.time <= W - d(i, m)
 * for every m. Without a bound for some m, input i's state is kept (spark.umjoin.stateTtl can bound
 * it).
 */
object StreamingWatermarks extends PredicateHelper {

  def eventTimeColumn(attributes: Seq[Attribute]): Option[Attribute] =
    attributes.find(_.metadata.contains(EventTimeWatermark.delayKey))

  /**
   * An input's late rows: those any of its filters decided at arrival drops (Spark's predicates),
   * or None.
   */
  def lateRows(input: Int, filters: Seq[SideLateFilter]): Option[Expression] =
    filters.filter(_.streams == Seq(input)).flatMap(f =>
      WatermarkSupport.watermarkExpression(Some(f.time), f.watermarkMs)).reduceOption(Or)

  /**
   * The column a stored row of a stream keeps for a filter over a partial combination: the join's
   * watermark (µs) at its arrival, NULL before there is one.
   */
  def mark(filter: SideLateFilter): Alias =
    Alias(BatchWatermark(filter.watermarkMs.map(_ * 1000)), s"__umjoin_late_${filter.name}")()

  /**
   * The condition a combination meets unless `filter` dropped its subtree: its event time above
   * `mark`, one stream's row's mark (Spark's comparison, a window's end for a window; a NULL
   * passes).
   */
  def notLate(filter: SideLateFilter, mark: Attribute): Expression = {
    val compared =
      if (filter.time.dataType.isInstanceOf[StructType])
        GetStructField(filter.time, 1) else filter.time
    Coalesce(Seq(Not(LessThanOrEqual(compared, mark)), Literal(true)))
  }

  /**
   * Stored rows of input `i` that can no longer join, or None if some other stream is unbounded.
   * `classes` are the join key classes; `conditions` all conditions of the group; `streams` the
   * inputs whose rows arrive over time; `checked` the streams whose own event-time column some late
   * filter checks (only their later rows are known to pass the watermark).
   */
  def evictableRows(
      i: Int,
      inputOutputs: Seq[Seq[Attribute]],
      classes: Seq[KeyClass],
      distance: TimeDistances,
      evictionWatermarkMs: Option[Long],
      streams: Seq[Int],
      checked: Set[Int]): Option[Expression] = evictionWatermarkMs.flatMap { watermark =>
    val others = streams.filter(_ != i)
    val bounds =
      others.map(m => laterRowsRuledOut(i, m, inputOutputs, classes, distance, watermark, checked))
    if (others.nonEmpty && bounds.forall(_.isDefined)) Some(bounds.flatten.reduce(And)) else None
  }

  /**
   * Stored rows of input `i` that no later row of stream `m` can join with (its later rows pass
   * the watermark W): i's key in a class with m's event-time column at or below W, or i's event
   * time at or below W - d(i, m). None without such a bound, or when no late filter checks m's
   * event time (`checked`).
   */
  def laterRowsRuledOut(i: Int, m: Int, inputOutputs: Seq[Seq[Attribute]], classes: Seq[KeyClass],
      distance: TimeDistances, watermark: Long, checked: Set[Int]): Option[Expression] =
    if (!checked.contains(m)) None
    else keyBound(i, m, inputOutputs, classes, watermark).orElse(distance(i)(m).flatMap { d =>
      WatermarkSupport.watermarkExpression(eventTimeColumn(inputOutputs(i)), Some(watermark - d))
    })

  /**
   * Combinations of the `preserved` inputs that no later row of the outer join's non-preserved
   * input `outer` can match any more: the rows Spark's outer join would evict from its preserved
   * side's state and put out with NULLs. A combination goes once one preserved input's row is ruled
   * out for every later row of `outer` (a later row passes the watermark W): its key in a class
   * with `outer`'s event-time column at or below W, or its event time at or below W - d(p, outer).
   * None when no preserved input is bounded so, or no late filter checks `outer`'s event time
   * (`checked`).
   */
  def unmatchableRows(
      outer: Int,
      preserved: Seq[Int],
      inputOutputs: Seq[Seq[Attribute]],
      classes: Seq[KeyClass],
      distance: TimeDistances,
      evictionWatermarkMs: Long,
      checked: Set[Int]): Option[Expression] =
    preserved.flatMap(p => laterRowsRuledOut(p, outer, inputOutputs, classes, distance,
      evictionWatermarkMs, checked)).reduceOption(Or)

  /**
   * Stored rows of input `i` that no combination still waiting to be padded by an outer join can
   * hold: every row of `start` (the stream whose event time the join's state watermark reads) such
   * a combination may hold with them is at or below the join's preserved-side state watermark
   * `stateWatermarkMs` (its time at most d(i, start) past theirs). None without such a bound.
   */
  def paddedBefore(i: Int, start: Int, inputOutputs: Seq[Seq[Attribute]], distance: TimeDistances,
      stateWatermarkMs: Option[Long]): Option[Expression] =
    for {
      watermark <- stateWatermarkMs
      d <- distance(i)(start)
      bound <- WatermarkSupport.watermarkExpression(eventTimeColumn(inputOutputs(i)),
        Some(watermark - d))
    } yield bound

  /**
   * A key class holding both a key of input i and input m's event-time column: keys at or below the
   * watermark (a time slice holds many times).
   */
  private def keyBound(i: Int, m: Int, inputOutputs: Seq[Seq[Attribute]], classes: Seq[KeyClass],
      watermark: Long): Option[Expression] =
    eventTimeColumn(inputOutputs(m)).flatMap { time =>
      classes.collectFirst {
        case c if c.members.exists { case (input, e) =>
          input == m && !e.isInstanceOf[TimeSlice] && e.references == AttributeSet(time)
        } && c.keyOf(i).isDefined =>
          c.keyOf(i).get
      }
    }.flatMap(key => WatermarkSupport.watermarkExpression(Some(key), Some(watermark)))

  /**
   * d(i)(m): the tightest bound (ms) the conditions put on m.time - i.time, through any chain of
   * inputs; None when unbounded. Direct bounds come from Spark's analysis of the conditions between
   * two inputs, asked relative to a far-away watermark so that no value is clipped (n² analyses of
   * every condition: computed once per group, not per input asked about). Each analysis is given
   * the conditions over the two inputs' columns only: Spark's finds no bound in one reading a third
   * input's column, and logs a warning with a stack trace for each.
   */
  def timeDistances(inputOutputs: Seq[Seq[Attribute]],
      conditions: Seq[Expression]): TimeDistances = {
    val n = inputOutputs.size
    val far = 1000000000000L
    val conjuncts = conditions.flatMap(splitConjunctivePredicates)
    val d = Array.tabulate(n, n) { (i, m) =>
      val columns = AttributeSet(inputOutputs(i) ++ inputOutputs(m))
      if (i == m) Some(0L)
      else for {
        _ <- eventTimeColumn(inputOutputs(i))
        _ <- eventTimeColumn(inputOutputs(m))
        between = conjuncts.filter(_.references.subsetOf(columns)).reduceOption(And)
        bound <- StreamingJoinHelper.getStateValueWatermark(AttributeSet(inputOutputs(i)),
          AttributeSet(inputOutputs(m)), between, Some(far))
      } yield far - bound
    }
    for (k <- 0 until n; i <- 0 until n; m <- 0 until n) {
      (d(i)(k), d(k)(m)) match {
        case (Some(a), Some(b)) if d(i)(m).forall(_ > a + b) => d(i)(m) = Some(a + b)
        case _ =>
      }
    }
    TimeDistances(d.map(_.toIndexedSeq).toIndexedSeq)
  }
}
