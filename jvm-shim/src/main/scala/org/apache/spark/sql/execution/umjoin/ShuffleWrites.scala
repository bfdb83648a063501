// The shuffle manager a task writes with is private to Spark.
package org.apache.spark.sql.execution.umjoin

import org.apache.spark.SparkEnv
import org.apache.spark.shuffle.sort.SortShuffleManager

object ShuffleWrites {
  /**
   * Whether the shuffle of this executor keeps the rows it is given before writing them, so that a
   * row handed to it must not be reused. Spark's sort-based shuffle writes an UnsafeRow's bytes as
   * they come where it bypasses merge-sorting or sorts serialized rows, which it does for every
   * partition count up to 2^24 (rows without an aggregator, serialized by UnsafeRowSerializer);
   * another shuffle manager may keep them.
   */
  def keepRows(partitions: Int): Boolean = SparkEnv.get.blockingShuffleManager match {
    case _: SortShuffleManager =>
      partitions > SortShuffleManager.MAX_SHUFFLE_OUTPUT_PARTITIONS_FOR_SERIALIZED_MODE
    case _ => true
  }
}
