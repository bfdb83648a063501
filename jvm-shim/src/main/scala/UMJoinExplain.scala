package umjoin.spark

import org.apache.spark.sql.ExtendedExplainGenerator
import org.apache.spark.sql.execution.SparkPlan

import umjoin.spark.batch.BatchUMJoinStrategy

/**
 * What `explain("extended")` and the SQL tab of Spark's UI show under "UMJoin": why each join of
 * the plan stays as Spark plans it (Spark's spark.sql.extendedExplainProviders; `umjoin.configure`
 * registers it). Each of Spark's joins is named as `explain()` shows it, with the reason the batch
 * strategy gave when it planned that join.
 */
final class UMJoinExplain extends ExtendedExplainGenerator {
  override def title: String = "UMJoin"

  override def generateExtendedInfo(plan: SparkPlan): String =
    BatchUMJoinStrategy.whyNot(plan)
      .map { case (node, join, reason) => s"$node ($join) stays Spark's: $reason" }.mkString("\n")
}
