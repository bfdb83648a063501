package umjoin.spark.streaming

import org.apache.hadoop.conf.Configuration

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.catalyst.plans.physical.Partitioning
import org.apache.spark.sql.execution.{SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperatorStateInfo,
  StateStoreWriter}
import org.apache.spark.sql.execution.streaming.state.StateSchemaValidationResult

/**
 * Stands for a stream-stream join that a StreamingUMJoin replaced, and only passes rows through.
 * Spark gives every stateful operator its watermarks by simulating their propagation over a plan,
 * by operator id, and may simulate over the previous micro-batch's executed plan, where the joins
 * are replaced: these nodes keep the replaced joins' ids there, on one input of the
 * StreamingUMJoin, in a chain that takes each id's input watermark where Spark's own join tree
 * would have it (`watermarkShiftMs` moves it on to the next node's; see
 * [[umjoin.spark.streaming.JoinWatermarks]]). It has no state (no stores, nothing to commit).
 */
case class StreamingUMJoinMemberExec(stateInfo: Option[StatefulOperatorStateInfo],
    watermarkShiftMs: Long, child: SparkPlan)
  extends UnaryExecNode with StateStoreWriter {

  override def nodeName: String = "StreamingUMJoinMember"
  override def shortName: String = "umJoinReplacedJoin"
  override val stateStoreNames: Seq[String] = Nil
  override def output: Seq[Attribute] = child.output
  override def outputPartitioning: Partitioning = child.outputPartitioning
  override def validateAndMaybeEvolveStateSchema(hadoopConf: Configuration, batchId: Long,
      stateSchemaVersion: Int): List[StateSchemaValidationResult] = Nil
  override protected def doExecute(): RDD[InternalRow] = child.execute()
  override def produceOutputWatermark(inputWatermarkMs: Long): Option[Long] =
    Some(inputWatermarkMs + watermarkShiftMs)

  override def simpleString(maxFields: Int): String =
    s"$nodeName [operator ${stateInfo.map(_.operatorId).getOrElse("?")}" +
      ": a join replaced by the StreamingUMJoin above]"

  override protected def withNewChildInternal(newChild: SparkPlan): StreamingUMJoinMemberExec =
    copy(child = newChild)
}
