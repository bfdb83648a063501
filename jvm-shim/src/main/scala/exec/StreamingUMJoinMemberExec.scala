package umjoin.spark.exec

import org.apache.hadoop.conf.Configuration

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.catalyst.plans.physical.Partitioning
import org.apache.spark.sql.execution.{SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperatorStateInfo, StateStoreWriter}
import org.apache.spark.sql.execution.streaming.state.StateSchemaValidationResult

/**
 * Stands for a stream-stream join that a StreamingUMJoin replaced, and only passes rows through.
 * Spark plans every micro-batch with the joins first and computes each stateful operator's
 * watermark by its operator id from the previous batch's executed plan; this node keeps the
 * replaced join's id in that plan. It has no state (no stores, nothing to commit).
 */
case class StreamingUMJoinMemberExec(stateInfo: Option[StatefulOperatorStateInfo], child: SparkPlan)
  extends UnaryExecNode with StateStoreWriter {

  override def nodeName: String = "StreamingUMJoinMember"
  override def shortName: String = "umJoinReplacedJoin"
  override val stateStoreNames: Seq[String] = Nil
  override def output: Seq[Attribute] = child.output
  override def outputPartitioning: Partitioning = child.outputPartitioning
  override def validateAndMaybeEvolveStateSchema(hadoopConf: Configuration, batchId: Long, stateSchemaVersion: Int): List[StateSchemaValidationResult] = Nil
  override protected def doExecute(): RDD[InternalRow] = child.execute()

  override def simpleString(maxFields: Int): String =
    s"$nodeName [operator ${stateInfo.map(_.operatorId).getOrElse("?")}: a join replaced by the StreamingUMJoin below]"

  override protected def withNewChildInternal(newChild: SparkPlan): StreamingUMJoinMemberExec = copy(child = newChild)
}
