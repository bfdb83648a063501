package umjoin.spark.planning

import org.apache.spark.sql.catalyst.analysis.StreamingJoinHelper
import org.apache.spark.sql.catalyst.expressions.{And, Attribute, AttributeSet, Expression, Or}
import org.apache.spark.sql.catalyst.plans.logical.EventTimeWatermark
import org.apache.spark.sql.execution.streaming.operators.stateful.WatermarkSupport

/**
 * Event-time watermarks for a streaming UMJoin's inputs.
 *
 * Late rows: an input's rows at or below the late-events watermark are dropped before they join or
 * are stored, with the predicate Spark's stream-stream join applies to that input's rows.
 *
 * Eviction: a stored row of input i can go once no future row of any other stream can complete a
 * result with it (a static table's rows do not arrive; they join the stream rows of each batch). Spark's binary tree may evict a leaf's rows earlier because it keeps their
 * intermediate results in the upper joins' state; UMJoin keeps none, so it evicts row r of input i
 * only when, for every other input m, a bound rules out every future row of m (whose event time
 * passes the watermark W): a join key class shared with m's event-time column (r's key at or below
 * W), or time-range conditions linking i to m, directly or through other inputs. Spark's own
 * analysis (StreamingJoinHelper.getStateValueWatermark) gives each direct bound d(i, m) on
 * m.time - i.time; bounds add up along paths (shortest paths over the inputs), and r goes when
 * r.time <= W - d(i, m) for every m. Without a bound for some m, input i's state is kept
 * (spark.umjoin.stateTtl can bound it).
 */
object StreamingWatermarks {

  def eventTimeColumn(attributes: Seq[Attribute]): Option[Attribute] =
    attributes.find(_.metadata.contains(EventTimeWatermark.delayKey))

  /** Rows of an input that are late: Spark's predicate for a join side, or None without watermark. */
  def lateRows(inputOutput: Seq[Attribute], lateEventsWatermarkMs: Option[Long]): Option[Expression] =
    WatermarkSupport.watermarkExpression(eventTimeColumn(inputOutput), lateEventsWatermarkMs)

  /**
   * Stored rows of input `i` that can no longer join, or None if some other stream is unbounded.
   * `classes` are the join key classes; `conditions` all conditions of the group; `streams` the
   * inputs whose rows arrive over time.
   */
  def evictableRows(
      i: Int,
      inputOutputs: Seq[Seq[Attribute]],
      classes: Seq[KeyClass],
      conditions: Seq[Expression],
      evictionWatermarkMs: Option[Long],
      streams: Seq[Int]): Option[Expression] = evictionWatermarkMs.flatMap { watermark =>
    val distance = timeDistances(inputOutputs, conditions)
    val others = streams.filter(_ != i)
    val bounds = others.map { m =>
      keyBound(i, m, inputOutputs, classes, watermark).orElse(distance(i)(m).flatMap { d =>
        WatermarkSupport.watermarkExpression(eventTimeColumn(inputOutputs(i)), Some(watermark - d))
      })
    }
    if (others.nonEmpty && bounds.forall(_.isDefined)) Some(bounds.flatten.reduce(And)) else None
  }

  /**
   * Combinations of the `preserved` inputs that no later row of the outer join's non-preserved input
   * `outer` can match any more: the rows Spark's outer join would evict from its preserved side's
   * state and put out with NULLs. A combination goes once one preserved input's row is ruled out
   * for every later row of `outer` (a later row passes the watermark W): its key in a class with
   * `outer`'s event-time column at or below W, or its event time at or below W - d(p, outer). None
   * when no preserved input is bounded so.
   */
  def unmatchableRows(
      outer: Int,
      preserved: Seq[Int],
      inputOutputs: Seq[Seq[Attribute]],
      classes: Seq[KeyClass],
      conditions: Seq[Expression],
      evictionWatermarkMs: Long): Option[Expression] = {
    val distance = timeDistances(inputOutputs, conditions)
    preserved.flatMap { p =>
      keyBound(p, outer, inputOutputs, classes, evictionWatermarkMs).orElse(distance(p)(outer).flatMap { d =>
        WatermarkSupport.watermarkExpression(eventTimeColumn(inputOutputs(p)), Some(evictionWatermarkMs - d))
      })
    }.reduceOption(Or)
  }

  /** A key class holding both a key of input i and input m's event-time column: keys at or below the watermark. */
  private def keyBound(i: Int, m: Int, inputOutputs: Seq[Seq[Attribute]], classes: Seq[KeyClass], watermark: Long): Option[Expression] =
    eventTimeColumn(inputOutputs(m)).flatMap { time =>
      classes.collectFirst {
        case c if c.members.exists { case (input, e) => input == m && e.references == AttributeSet(time) } && c.keyOf(i).isDefined =>
          c.keyOf(i).get
      }
    }.flatMap(key => WatermarkSupport.watermarkExpression(Some(key), Some(watermark)))

  /**
   * d(i)(m): the tightest bound (ms) the conditions put on m.time - i.time, through any chain of
   * inputs; None when unbounded. Direct bounds come from Spark's analysis of the conditions between
   * two inputs, asked relative to a far-away watermark so that no value is clipped.
   */
  private def timeDistances(inputOutputs: Seq[Seq[Attribute]], conditions: Seq[Expression]): IndexedSeq[IndexedSeq[Option[Long]]] = {
    val n = inputOutputs.size
    val far = 1000000000000L
    val condition = conditions.reduceOption(And)
    val d = Array.tabulate(n, n) { (i, m) =>
      if (i == m) Some(0L)
      else for {
        _ <- eventTimeColumn(inputOutputs(i))
        _ <- eventTimeColumn(inputOutputs(m))
        bound <- StreamingJoinHelper.getStateValueWatermark(AttributeSet(inputOutputs(i)), AttributeSet(inputOutputs(m)), condition, Some(far))
      } yield far - bound
    }
    for (k <- 0 until n; i <- 0 until n; m <- 0 until n) {
      (d(i)(k), d(k)(m)) match {
        case (Some(a), Some(b)) if d(i)(m).forall(_ > a + b) => d(i)(m) = Some(a + b)
        case _ =>
      }
    }
    d.map(_.toIndexedSeq).toIndexedSeq
  }
}
