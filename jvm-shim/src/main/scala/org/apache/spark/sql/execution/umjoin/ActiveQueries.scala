// The running streaming queries of a Spark application are private to Spark (SharedState's
// activeStreamingQueries), so this lookup lives in a package below org.apache.spark.sql, as the
// in-memory stores do (state/InMemoryStore.scala).
package org.apache.spark.sql.execution.umjoin

import java.util.UUID

import org.apache.spark.sql.classic.SparkSession
import org.apache.spark.sql.execution.streaming.runtime.StreamExecution

object ActiveQueries {
  /** The running query with this id, in any session of the application. */
  def byId(session: SparkSession, queryId: UUID): Option[StreamExecution] =
    Option(session.sharedState.activeStreamingQueries.get(queryId))

  /** The session a query run plans and runs its micro-batches in (its own clone). */
  def sessionOf(execution: StreamExecution): SparkSession = execution.sparkSessionForStream
}
