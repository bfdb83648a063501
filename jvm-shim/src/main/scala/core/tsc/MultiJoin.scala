package umjoin.spark.core.tsc

import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan

/**
 * The multi-way join node TSC step 2 puts into a logical plan in place of a group: it shows what
 * TSC found (plan inspection, plan-diff). Batch execution does not go through it: the planner
 * strategy plans each group root directly as a UMJoin.
 */
final case class MultiJoin(inputs: Seq[LogicalPlan], output: Seq[Attribute]) extends LogicalPlan {
  override def children: Seq[LogicalPlan] = inputs
  override protected def withNewChildrenInternal(newChildren: IndexedSeq[LogicalPlan]): MultiJoin =
    copy(inputs = newChildren)
}
