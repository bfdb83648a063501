package umjoin.spark.batch

import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.adaptive.BroadcastQueryStageExec

/**
 * Under AQE, after each re-planning and before AQE checks the new plan: a UMJoin input that is a
 * broadcast stage AQE already ran becomes that stage's exchange again. AQE's check
 * (ValidateSparkPlan) accepts a finished broadcast stage only as the build side of Spark's own
 * broadcast joins and drops the whole re-plan otherwise, so the query's other joins would keep the
 * strategies they had; from the exchange, AQE finds the stage in its stage cache again, and nothing
 * is broadcast twice.
 */
object BroadcastStageInputs extends Rule[SparkPlan] {
  override def apply(plan: SparkPlan): SparkPlan = plan.transformUp {
    case umjoin: UMJoinExec if umjoin.children.exists(_.isInstanceOf[BroadcastQueryStageExec]) =>
      umjoin.withNewChildren(umjoin.children.map {
        case stage: BroadcastQueryStageExec => stage.plan
        case input => input
      })
  }
}
