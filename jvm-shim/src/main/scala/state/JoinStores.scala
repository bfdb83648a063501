package umjoin.spark.state

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.sql.execution.umjoin.{InMemoryStore, SpillingStore}

/** What a task's store reports as SQL metrics when the task ends. */
final case class StoreMetrics(memtableBytes: SQLMetric, diskBytes: SQLMetric, blockCacheHits: SQLMetric, blockCacheMisses: SQLMetric, spills: SQLMetric)

/** Builds the store of one input's partition with the configured backend. */
object JoinStores {

  /**
   * Reads `rows` (the input's partition) into a store indexed by `keys` (bound to `inputOutput`).
   * The store is closed, and its directory deleted, when the task ends however it ends; its
   * metrics are recorded just before.
   */
  def build(
      settings: StoreSettings,
      rows: Iterator[InternalRow],
      keys: Seq[Expression],
      inputOutput: Seq[Attribute],
      input: Int,
      context: TaskContext,
      metrics: StoreMetrics): JoinStore = {
    val store = settings.backend match {
      case StateBackend.Memory =>
        InMemoryStore.build(rows, keys, inputOutput, context)
      case StateBackend.RocksDB =>
        val disk = RocksDBStore.create(settings.rocksdb, inputOutput.size, input, context)
        closeWhenDone(disk, context, metrics)
        fill(rows, keys, inputOutput, disk.add)
        disk
      case StateBackend.Auto =>
        val spilling = new SpillingStore(context, inputOutput.size, settings.maxStoreMemory.getOrElse(Long.MaxValue),
          () => RocksDBStore.create(settings.rocksdb, inputOutput.size, input, context))
        closeWhenDone(spilling, context, metrics)
        fill(rows, keys, inputOutput, spilling.add)
        spilling
    }
    store
  }

  /** Adds every row whose key has no NULL (NULL never equals anything). */
  private def fill(rows: Iterator[InternalRow], keys: Seq[Expression], inputOutput: Seq[Attribute], add: (UnsafeRow, UnsafeRow) => Unit): Unit = {
    val keyOf = UnsafeProjection.create(keys)
    val toUnsafe = UnsafeProjection.create(inputOutput, inputOutput)
    rows.foreach { row =>
      val key = keyOf(row)
      if (!key.anyNull) {
        add(key, row match {
          case u: UnsafeRow => u
          case other => toUnsafe(other)
        })
      }
    }
  }

  private def closeWhenDone(store: JoinStore, context: TaskContext, metrics: StoreMetrics): Unit =
    context.addTaskCompletionListener[Unit] { _ =>
      val disk = store match {
        case r: RocksDBStore => Some(r)
        case s: SpillingStore =>
          s.diskStore.foreach(_ => metrics.spills += 1)
          s.diskStore
        case _ => None
      }
      disk.foreach { d =>
        metrics.memtableBytes += d.memtableBytes
        metrics.diskBytes += d.diskBytes
        metrics.blockCacheHits += d.blockCacheHits
        metrics.blockCacheMisses += d.blockCacheMisses
      }
      store.close()
    }
}
