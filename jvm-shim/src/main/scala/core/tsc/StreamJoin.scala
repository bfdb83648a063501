package umjoin.spark.core.tsc

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression}
import org.apache.spark.sql.catalyst.plans.{JoinType, LeftAnti, LeftOuter, LeftSemi, RightOuter}
import org.apache.spark.sql.execution.{BinaryExecNode, SparkPlan}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.operators.stateful.join.{
  StreamingSymmetricHashJoinExec, StreamingSymmetricHashJoinHelper}
import org.apache.spark.sql.execution.streaming.operators.stateful.join.
  StreamingSymmetricHashJoinHelper.JoinConditionSplitPredicates

/**
 * A stream-stream join of the logical plan as the streaming planner sees it: what Spark's
 * StreamingSymmetricHashJoinExec would be (keys, condition split by side, the watermarks Spark's
 * simulation gives it), without being one. Spark's join broadcasts the Hadoop configuration each
 * time it is constructed, and Spark constructs a join 8-13 times per micro-batch; this one only
 * describes, and never runs (the planner puts a StreamingUMJoin or Spark's own join in its place).
 */
final case class StreamJoinMember(
    leftKeys: Seq[Expression],
    rightKeys: Seq[Expression],
    joinType: JoinType,
    condition: JoinConditionSplitPredicates,
    eventTimeWatermarkForLateEvents: Option[Long],
    eventTimeWatermarkForEviction: Option[Long],
    left: SparkPlan,
    right: SparkPlan) extends BinaryExecNode {

  override def nodeName: String = "StreamJoinMember"

  override def output: Seq[Attribute] = joinType match {
    case LeftOuter => left.output ++ right.output.map(_.withNullability(true))
    case RightOuter => left.output.map(_.withNullability(true)) ++ right.output
    case LeftSemi | LeftAnti => left.output
    case _ => left.output ++ right.output
  }

  /** Spark's stream-stream join's: the lower of its two sides' state watermarks. */
  def produceOutputWatermark(inputWatermarkMs: Long): Option[Long] = {
    val (l, r) = StreamingSymmetricHashJoinHelper.getStateWatermark(left.output, right.output,
      leftKeys, rightKeys, condition.full, Some(inputWatermarkMs), false)
    Some((l.toSeq ++ r.toSeq).minOption.getOrElse(inputWatermarkMs))
  }

  override protected def doExecute(): RDD[InternalRow] =
    throw new IllegalStateException("a StreamJoinMember describes a join for the planner only")

  override protected def withNewChildrenInternal(newLeft: SparkPlan,
      newRight: SparkPlan): StreamJoinMember = copy(left = newLeft, right = newRight)
}

/**
 * A stream-stream join as the streaming planner reads it, from Spark's planned join or from a
 * [[StreamJoinMember]]. `node` is the plan node (compared by identity); `stateInfo` is Spark's
 * (a planned join only).
 */
final case class StreamJoin(
    node: SparkPlan,
    joinType: JoinType,
    leftKeys: Seq[Expression],
    rightKeys: Seq[Expression],
    condition: JoinConditionSplitPredicates,
    left: SparkPlan,
    right: SparkPlan,
    lateEventsWatermark: Option[Long],
    evictionWatermark: Option[Long],
    stateInfo: Option[StatefulOperatorStateInfo]) {

  def produceOutputWatermark(inputWatermarkMs: Long): Option[Long] = node match {
    case j: StreamingSymmetricHashJoinExec => j.produceOutputWatermark(inputWatermarkMs)
    case j: StreamJoinMember => j.produceOutputWatermark(inputWatermarkMs)
  }
}

object StreamJoin {
  def unapply(plan: SparkPlan): Option[StreamJoin] = plan match {
    case j: StreamingSymmetricHashJoinExec =>
      Some(StreamJoin(j, j.joinType, j.leftKeys, j.rightKeys, j.condition, j.left, j.right,
        j.eventTimeWatermarkForLateEvents, j.eventTimeWatermarkForEviction, j.stateInfo))
    case j: StreamJoinMember =>
      Some(StreamJoin(j, j.joinType, j.leftKeys, j.rightKeys, j.condition, j.left, j.right,
        j.eventTimeWatermarkForLateEvents, j.eventTimeWatermarkForEviction, None))
    case _ => None
  }
}
