package umjoin.spark.streaming

import org.apache.spark.sql.catalyst.analysis.StreamingJoinHelper
import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeSet, Expression, IsNull}
import org.apache.spark.sql.catalyst.plans.{LeftAnti, LeftOuter}
import org.apache.spark.sql.catalyst.plans.logical.{Filter, Join, LogicalPlan, Project}
import org.apache.spark.sql.catalyst.rules.Rule

import umjoin.spark.UMJoinConf
import umjoin.spark.core.probe.ProbeSteps

/**
 * Lets a LEFT ANTI join of two streams run, which Spark refuses ("LeftAnti joins with a streaming
 * DataFrame/Dataset on the right are not supported"): it becomes the LEFT OUTER join of the same
 * condition keeping only the rows padded with NULLs, the left side's columns (what a user writes by
 * hand for it). A left row comes out once, when the watermark rules out a match and none matched,
 * in the micro-batch Spark's outer join puts out its padded row. A padded row is told by a column
 * of the right side that the condition compares (`=`, `<`, ... in one of its conjuncts): NULL
 * where padded, never NULL where matched. An analyzer rule, because Spark's check of streaming
 * operations reads the analyzed plan; only with `spark.umjoin.enabled`.
 */
object StreamAntiJoins extends Rule[LogicalPlan] {
  override def apply(plan: LogicalPlan): LogicalPlan =
    if (!plan.isStreaming || !UMJoinConf.Enabled(key => Option(conf.getConfString(key, null)))) plan
    else plan.transformUp {
      case j @ Join(left, right, LeftAnti, Some(condition), _) if left.isStreaming &&
          right.isStreaming =>
        val outer = j.copy(joinType = LeftOuter)
        val evicted = StreamingJoinHelper.isWatermarkInJoinKeys(outer) ||
          StreamingJoinHelper.getStateValueWatermark(left.outputSet, right.outputSet,
            Some(condition), Some(0L)).isDefined
        if (!evicted) throw refusal(condition,
          "no watermark in its join keys, and no watermark on the right side with a time range " +
            "bounding it by the left side's event time (e.g. r.time BETWEEN l.time AND l.time + " +
            "INTERVAL 10 MINUTES), so a left row would wait for a match forever")
        val marker = matchedMarker(condition, right.outputSet).getOrElse(throw refusal(condition,
          "no conjunct of its condition compares a column of the right side (e.g. l.k = r.k), " +
            "which tells a matched row from a padded one"))
        Project(left.output, Filter(IsNull(marker), outer))
    }

  /**
   * A right-side column a conjunct of `condition` compares (not null-safe): never NULL in a matched
   * row.
   */
  private def matchedMarker(condition: Expression, right: AttributeSet): Option[Attribute] =
    ProbeSteps.comparedColumns(condition).find(right.contains)

  private def refusal(condition: Expression, missing: String): UnsupportedOperationException =
    new UnsupportedOperationException(
      s"UMJoin cannot run the LEFT ANTI join of two streams ON ${condition.sql}" +
        s": it has $missing. " +
        ("Spark refuses a left anti join of two streams; UMJoin runs it as a left outer join " +
          "keeping the unmatched left rows, ") +
        "which needs a watermark that rules out later matches.")
}
