// Spark's HashedRelation and a task's memory manager are private to Spark, so the in-memory stores
// that use them (this one and SpillingStore) live in a package below org.apache.spark.sql.execution.
// Nothing else of the shim does.
package org.apache.spark.sql.execution.umjoin

import org.apache.spark.TaskContext
import org.apache.spark.broadcast.Broadcast
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.joins.HashedRelation

import umjoin.spark.state.JoinStore

/** A store in Spark's own memory-managed hash map (BytesToBytesMap / LongToUnsafeRowMap of UnsafeRows). */
final class InMemoryStore private (relation: HashedRelation) extends JoinStore {
  override val isEmpty: Boolean = !relation.keys().hasNext
  override def get(key: UnsafeRow): Iterator[InternalRow] = {
    val rows = relation.get(key)
    if (rows == null) Iterator.empty else rows
  }
  override def sizeInBytes: Long = relation.estimatedSize
  override def close(): Unit = relation.close()
}

object InMemoryStore {

  /**
   * Builds the store of one task's partition of an input, in memory granted by the task's memory
   * manager; freed when the task ends. `keys` are bound to the input's output.
   */
  def build(rows: Iterator[InternalRow], keys: Seq[Expression], inputOutput: Seq[Attribute], context: TaskContext): InMemoryStore = {
    // The hash map copies UnsafeRow bytes; most operators already produce UnsafeRows.
    lazy val toUnsafe = UnsafeProjection.create(inputOutput, inputOutput)
    val unsafeRows = rows.map {
      case u: UnsafeRow => u
      case other => toUnsafe(other)
    }
    val relation = HashedRelation(unsafeRows, keys, 64, context.taskMemoryManager())
    val store = new InMemoryStore(relation)
    context.addTaskCompletionListener[Unit](_ => store.close())
    store
  }

  /** The broadcast this input's store is built into by Spark's broadcast exchange. */
  def broadcastOf(plan: SparkPlan): Broadcast[Any] = plan.executeBroadcast[Any]()

  /** The task's read-only view of a broadcast store. */
  def fromBroadcast(broadcast: Broadcast[Any]): InMemoryStore =
    new InMemoryStore(broadcast.value.asInstanceOf[HashedRelation].asReadOnlyCopy())
}
