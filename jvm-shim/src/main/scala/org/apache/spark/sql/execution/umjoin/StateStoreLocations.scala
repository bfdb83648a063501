// Spark's state store coordinator is private to Spark
// (StreamingQueryManager.stateStoreCoordinator), so this lookup lives in a package below
// org.apache.spark.sql, as ActiveQueries does.
package org.apache.spark.sql.execution.umjoin

import org.apache.spark.sql.classic.SparkSession
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId

object StateStoreLocations {
  /**
   * Per partition, the executors that last loaded any of the operator's `storeNames` there: where
   * its next task should run so that it finds its stores loaded, as Spark's
   * stateStoreAwareZipPartitions places a stream-stream join's tasks (that one zips two inputs; a
   * StreamingUMJoin zips many).
   */
  def of(session: SparkSession, info: StatefulOperatorStateInfo,
      storeNames: Seq[String]): Int => Seq[String] = {
    val coordinator = session.streams.stateStoreCoordinator
    partition => storeNames.flatMap(name =>
      coordinator.getLocation(StateStoreProviderId(info, partition, name))).distinct
  }
}
