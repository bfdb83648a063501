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
   * Reads `rows` (the input's partition) into one store per index, `indexKeys` being each index's
   * key bound to `inputOutput`. The stores are closed, and their directories deleted, when the task
   * ends however it ends; their metrics are recorded just before.
   */
  def build(
      settings: StoreSettings,
      rows: Iterator[InternalRow],
      indexKeys: Seq[Seq[Expression]],
      inputOutput: Seq[Attribute],
      input: Int,
      context: TaskContext,
      metrics: StoreMetrics): Seq[JoinStore] = settings.backend match {
    case StateBackend.Memory =>
      InMemoryStore.build(rows, indexKeys, inputOutput, context)
    case StateBackend.RocksDB =>
      val stores = indexKeys.map(_ => RocksDBStore.create(settings.rocksdb, inputOutput.size, input, context))
      stores.foreach(closeWhenDone(_, context, metrics))
      fill(rows, indexKeys, inputOutput, stores.map(s => (key: UnsafeRow, row: UnsafeRow) => s.add(key, row)))
      stores
    case StateBackend.Auto =>
      val stores = indexKeys.map(_ => new SpillingStore(context, inputOutput.size, settings.maxStoreMemory.getOrElse(Long.MaxValue),
        () => RocksDBStore.create(settings.rocksdb, inputOutput.size, input, context)))
      stores.foreach(closeWhenDone(_, context, metrics))
      fill(rows, indexKeys, inputOutput, stores.map(s => (key: UnsafeRow, row: UnsafeRow) => s.add(key, row)))
      stores
  }

  /** Adds every row to each index whose key for it has no NULL (NULL never equals anything). */
  private def fill(rows: Iterator[InternalRow], indexKeys: Seq[Seq[Expression]], inputOutput: Seq[Attribute],
      adds: Seq[(UnsafeRow, UnsafeRow) => Unit]): Unit = {
    val keyOf = indexKeys.map(keys => UnsafeProjection.create(keys))
    val toUnsafe = UnsafeProjection.create(inputOutput, inputOutput)
    rows.foreach { row =>
      val unsafe = row match {
        case u: UnsafeRow => u
        case other => toUnsafe(other)
      }
      keyOf.indices.foreach { i =>
        val key = keyOf(i)(unsafe)
        if (!key.anyNull) adds(i)(key, unsafe)
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
