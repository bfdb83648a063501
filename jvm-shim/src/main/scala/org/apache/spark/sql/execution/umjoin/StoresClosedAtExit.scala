// Spark's shutdown hooks (ShutdownHookManager, ordered by priority) are private to Spark, so this
// hook is registered from a package below org.apache.spark.sql, as ActiveQueries does its lookup.
package org.apache.spark.sql.execution.umjoin

import org.apache.spark.sql.execution.streaming.state.StateStore
import org.apache.spark.util.ShutdownHookManager

/**
 * Closes the state stores this JVM has loaded when it exits, after Spark's context has stopped and
 * before Spark deletes its local directories (where RocksDB keeps its files).
 *
 * Why: a RocksDB compaction still running when the JVM exits writes RocksDB's log through Spark's
 * Java logger, so its thread asks to enter the JVM, which the exiting JVM no longer lets it do,
 * while the exit waits for that very thread: the process hangs. It did after every TPC-H Q3 block
 * at SF 1 (whose stores are large enough to compact as the last micro-batch commits). Closing a
 * store waits for its compactions to end.
 */
object StoresClosedAtExit {
  private lazy val registered: AnyRef =
    ShutdownHookManager.addShutdownHook(ShutdownHookManager.SPARK_CONTEXT_SHUTDOWN_PRIORITY - 10) {
      () => StateStore.stop()
    }

  /** Registers the hook, once per JVM. */
  def ensure(): Unit = registered
}
