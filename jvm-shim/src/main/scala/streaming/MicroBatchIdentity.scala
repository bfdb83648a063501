package umjoin.spark.streaming

import java.util.UUID

import scala.util.Try

import org.apache.hadoop.fs.Path

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.classic.{SparkSession => ClassicSession}
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperator,
  StatefulOperatorStateInfo}
import org.apache.spark.sql.execution.streaming.runtime.{MicroBatchExecution, StreamExecution}

import org.apache.spark.sql.execution.umjoin.ActiveQueries

/**
 * The streaming query a micro-batch plan belongs to, for a StreamingUMJoin without a stream-stream
 * join to take its state's place from (one stream joined with stored static tables). Spark plans a
 * micro-batch on the query's own thread, with the query's id and the batch id set as the thread's
 * local properties; the query (its checkpoint, its run id) is found from its id among the active
 * queries.
 *
 * @param checkpointLocation where the query's state lives (`<checkpoint>/state`)
 */
final case class MicroBatchIdentity(checkpointLocation: String, runId: UUID, batchId: Long) {

  /**
   * The state of a new stateful operator: its id follows every id Spark gave the plan's own
   * stateful operators (`slot` tells the new operators of one plan apart), so it is the same in
   * every micro-batch and after a restart of the same query.
   */
  def newOperator(plan: SparkPlan, slot: Int, partitions: Int): StatefulOperatorStateInfo = {
    val sparks = plan.collect { case s: StatefulOperator => s.stateInfo.map(_.operatorId) }.flatten
    StatefulOperatorStateInfo(checkpointLocation, runId, sparks.maxOption.map(_ + 1).getOrElse(0L) +
      slot, batchId, partitions)
  }
}

object MicroBatchIdentity {

  /**
   * The micro-batch being planned on this thread, if the thread runs a micro-batch streaming query.
   */
  def current(session: SparkSession): Option[MicroBatchIdentity] = {
    val sc = session.sparkContext
    for {
      queryId <- Option(sc.getLocalProperty(StreamExecution.QUERY_ID_KEY))
        .flatMap(id => Try(UUID.fromString(id)).toOption)
      batchId <- Option(sc.getLocalProperty(MicroBatchExecution.BATCH_ID_KEY))
        .flatMap(_.toLongOption)
      classic <- Option(session).collect { case c: ClassicSession => c }
      query <- ActiveQueries.byId(classic, queryId)
      if query.isInstanceOf[MicroBatchExecution]
    } yield MicroBatchIdentity(new Path(query.resolvedCheckpointRoot, "state").toString,
      query.runId, batchId)
  }
}
