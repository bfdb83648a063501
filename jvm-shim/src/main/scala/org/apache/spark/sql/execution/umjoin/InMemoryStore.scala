// Spark's HashedRelation and a task's memory manager are private to Spark, so the in-memory stores
// that use them (this one, PagedStore and SpillingStore) live in a package below
// org.apache.spark.sql.execution. Nothing else of the shim does.
package org.apache.spark.sql.execution.umjoin

import org.apache.spark.TaskContext
import org.apache.spark.broadcast.Broadcast
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression, UnsafeRow}
import org.apache.spark.sql.execution.{ExternalAppendOnlyUnsafeRowArray, SparkPlan}
import org.apache.spark.sql.execution.joins.{HashedRelation, LongHashedRelation}

import umjoin.spark.core.store.{JoinStore, SmallStore}

/**
 * A store in Spark's own memory-managed hash map (BytesToBytesMap / LongToUnsafeRowMap of
 * UnsafeRows). `owned`: the task built it and frees it; otherwise it is a broadcast table other
 * tasks share.
 */
final class InMemoryStore private[umjoin] (relation: HashedRelation, owned: Boolean)
  extends JoinStore {
  override val isEmpty: Boolean = !relation.keys().hasNext
  override def get(key: UnsafeRow): Iterator[InternalRow] = {
    val rows = relation.get(key)
    if (rows == null) Iterator.empty else rows
  }
  override val keysAreUnique: Boolean = relation.keyIsUnique
  override def getOne(key: UnsafeRow): InternalRow = relation.getValue(key)
  // Spark builds a long-keyed map for a key of one LongType column (as UMJoinExec.hashable keys
  // one of an integral type): the value is looked up as it is.
  private val longKeyed = relation.isInstanceOf[LongHashedRelation]
  override def getLong(key: Long): Iterator[InternalRow] =
    if (!longKeyed) super.getLong(key)
    else {
      val rows = relation.get(key)
      if (rows == null) Iterator.empty else rows
    }
  override def getOneLong(key: Long): InternalRow =
    if (longKeyed) relation.getValue(key) else super.getOneLong(key)
  override def sizeInBytes: Long = relation.estimatedSize
  override lazy val keyCount: Long = relation.keys().size.toLong
  override def close(): Unit = if (owned) relation.close()
}

object InMemoryStore {

  /**
   * The stores of a batch task's partition of an input, one per index (`indexKeys`, bound to the
   * input's output). Rows that fit in a small store's bytes stay in JVM maps; more go to Spark's
   * hash maps, as Spark's own hash joins hold a partition, in memory granted by the task's memory
   * manager, freed when the task ends. With several indexes those rows are read once into Spark's
   * spillable row buffer and indexed from there. (A streaming task's micro-batch rows:
   * [[PagedStore]].)
   */
  def build(rows: Iterator[InternalRow], indexKeys: Seq[Seq[Expression]],
      inputOutput: Seq[Attribute], context: TaskContext): Seq[JoinStore] =
    SmallStore.buildOr(rows, indexKeys, inputOutput) { all =>
      val stores = indexKeys match {
        case Seq(keys) => Seq(new InMemoryStore(HashedRelation(all, keys, 64,
          context.taskMemoryManager()), owned = true))
        case _ =>
          val buffer =
            new ExternalAppendOnlyUnsafeRowArray(4096, Long.MaxValue, Int.MaxValue, Long.MaxValue)
          all.foreach(buffer.add)
          val built = indexKeys.map(keys => new InMemoryStore(HashedRelation(
            buffer.generateIterator(), keys, 64, context.taskMemoryManager()), owned = true))
          buffer.clear()
          built
      }
      stores.foreach(store => context.addTaskCompletionListener[Unit](_ => store.close()))
      stores
    }
}

/**
 * A broadcast input's hash table (its plan's broadcast mode is HashedRelationBroadcastMode), as a
 * UMJoin's tasks use it.
 */
final class BroadcastTable private (broadcast: Broadcast[HashedRelation]) extends Serializable {
  /** The table's size, read where it was built (the driver). */
  def sizeInBytes: Long = broadcast.value.estimatedSize

  /**
   * A task's view of the table (its own read cursor over the map the executor's tasks share); never
   * freed by the task.
   */
  def store(): InMemoryStore = new InMemoryStore(broadcast.value.asReadOnlyCopy(), owned = false)
}

object BroadcastTable {
  def of(plan: SparkPlan): BroadcastTable =
    new BroadcastTable(plan.executeBroadcast[HashedRelation]())
}
