package umjoin.spark.streaming

import org.apache.hadoop.conf.Configuration

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, SortOrder}
import org.apache.spark.sql.catalyst.optimizer.JoinSelectionHelper
import org.apache.spark.sql.catalyst.plans.logical.{Filter, Join, LocalRelation, LogicalPlan,
  Project, ReturnAnswer}
import org.apache.spark.sql.catalyst.plans.physical.Partitioning
import org.apache.spark.sql.execution.{SparkPlan, SparkStrategy, UnaryExecNode}
import org.apache.spark.sql.execution.datasources.{HadoopFsRelation, LogicalRelation}
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperator,
  StatefulOperatorStateInfo}
import org.apache.spark.sql.execution.streaming.state.StateSchemaValidationResult
import org.apache.spark.sql.internal.SQLConf

import umjoin.spark.UMJoinConf

/**
 * Keeps a micro-batch whose stream-static joins may store a table in a StreamingUMJoin from being
 * planned adaptively. Spark runs a micro-batch without stateful operators under AQE (on by
 * default), query stage by query stage, so the streaming rule would only ever see parts of the
 * join; but it leaves every plan that holds a stateful operator non-adaptive (Spark 4.3's
 * InsertAdaptiveSparkPlan). Where the micro-batch joins a stream with at least
 * `spark.umjoin.minInputs` inputs, one of them a table the StreamingUMJoin would store, this
 * strategy puts a [[WholeMicroBatchExec]] on top of the plan; the streaming rule, which then sees
 * the whole plan, removes it. A micro-batch is planned the same with AQE on and off, so a
 * checkpoint can continue under either.
 */
final class WholeMicroBatchStrategy(session: SparkSession)
  extends SparkStrategy with JoinSelectionHelper {

  override def apply(plan: LogicalPlan): Seq[SparkPlan] = plan match {
    case ReturnAnswer(root) if mayStoreStaticTables(root) =>
      Seq(WholeMicroBatchExec(planLater(root)))
    case _ => Nil
  }

  private def mayStoreStaticTables(root: LogicalPlan): Boolean = {
    val sqlConf = session.sessionState.conf
    lazy val conf = UMJoinConf.from(sqlConf)
    // A stream-stream join makes the plan stateful, and so non-adaptive, without help.
    root.isStreaming && WholeMicroBatchStrategy.sparkPlansAdaptively(sqlConf) &&
      conf.enabled && conf.staticTables != StaticTablesMode.Reread &&
      !root.exists { case j: Join => j.left.isStreaming && j.right.isStreaming; case _ => false } &&
      root.collect { case j: Join => joinedInputs(j) }.exists { inputs =>
        val batchRows = inputs.filter(_.isStreaming).map(StaticStoring.estimatedRows).sum
        inputs.size >= conf.minInputsOf(timeSliced = false) && inputs.exists(_.isStreaming) &&
          inputs.exists(input => storable(input, sqlConf) && StaticStoring.stores(
            conf.staticTables, Some(StaticStoring.estimatedRows(input)), Some(batchRows)))
      }
  }

  /**
   * The inputs of the join tree under `plan`, through the projections and filters between its
   * joins.
   */
  private def joinedInputs(plan: LogicalPlan): Seq[LogicalPlan] = plan match {
    case j: Join => joinedInputs(j.left) ++ joinedInputs(j.right)
    case p @ (_: Project | _: Filter) if p.children.head.isInstanceOf[Join] =>
      joinedInputs(p.children.head)
    case other => Seq(other)
  }

  /**
   * A static input the streaming rule would store: too large to broadcast, read from files, the
   * same rows every batch (on the logical plan, what [[StaticVersions.versionable]] checks on the
   * physical one).
   */
  private def storable(input: LogicalPlan, sqlConf: SQLConf): Boolean =
    !input.isStreaming && !canBroadcastBySize(input, sqlConf) &&
      !input.exists(p => p.expressions.exists(!_.deterministic) || p.subqueries.nonEmpty) &&
      input.collectLeaves().forall {
        case r: LogicalRelation => r.relation.isInstanceOf[HadoopFsRelation]
        case leaf => leaf.isInstanceOf[LocalRelation]
      }
}

object WholeMicroBatchStrategy {
  /**
   * Whether Spark plans a micro-batch without stateful operators adaptively (AQE, and AQE for
   * stateless streaming).
   */
  def sparkPlansAdaptively(conf: SQLConf): Boolean =
    conf.adaptiveExecutionEnabled && conf.adaptiveExecutionEnabledInStatelessStreaming
}

/**
 * Marks a micro-batch plan the streaming rule must see whole (see [[WholeMicroBatchStrategy]]): a
 * stateful operator for Spark's AQE check, with no state and no stores, passing rows through. The
 * streaming rule removes it before anything runs.
 */
final case class WholeMicroBatchExec(child: SparkPlan) extends UnaryExecNode with StatefulOperator {
  override def stateInfo: Option[StatefulOperatorStateInfo] = None
  override def output: Seq[Attribute] = child.output
  override def outputPartitioning: Partitioning = child.outputPartitioning
  override def outputOrdering: Seq[SortOrder] = child.outputOrdering
  override def validateAndMaybeEvolveStateSchema(hadoopConf: Configuration, batchId: Long,
      stateSchemaVersion: Int): List[StateSchemaValidationResult] = Nil
  override protected def doExecute(): RDD[InternalRow] = child.execute()
  override protected def withNewChildInternal(newChild: SparkPlan): WholeMicroBatchExec =
    copy(child = newChild)
}
