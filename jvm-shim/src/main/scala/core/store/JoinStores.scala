package umjoin.spark.core.store

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression,
  UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.metric.SQLMetric

import org.apache.spark.sql.execution.umjoin.{InMemoryStore, SpillingStore}

/** What a task's store reports as SQL metrics when the task ends. */
final case class StoreMetrics(memtableBytes: SQLMetric, diskBytes: SQLMetric,
    blockCacheHits: SQLMetric, blockCacheMisses: SQLMetric, spills: SQLMetric)

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
    case StateBackend.RocksDB | StateBackend.Auto =>
      val stores =
        indexKeys.map(_ => appendable(settings, inputOutput.size, input, context, metrics))
      val add = adder(stores, indexKeys, inputOutput)
      rows.foreach(add)
      stores
  }

  /**
   * An empty store to add rows to as they arrive: RocksDB with `rocksdb`, else Spark's
   * memory-managed map, with `auto` moved to RocksDB if memory is refused. Closed like the others
   * when the task ends.
   */
  def appendable(settings: StoreSettings, numFields: Int, input: Int, context: TaskContext,
      metrics: StoreMetrics): AppendableStore = {
    val store = settings.backend match {
      case StateBackend.RocksDB => RocksDBStore.create(settings.rocksdb, numFields, input, context)
      case StateBackend.Auto =>
        new SpillingStore(context, numFields, settings.maxStoreMemory.getOrElse(Long.MaxValue),
          () => RocksDBStore.create(settings.rocksdb, numFields, input, context))
      case StateBackend.Memory =>
        new SpillingStore(context, numFields, Long.MaxValue, () => throw new IllegalStateException(
          "UMJoin's in-memory store of input " +
            s"$input ran out of task memory; set spark.umjoin.stateBackend=auto " +
            "(moves it to RocksDB) or rocksdb, or give Spark more memory"))
    }
    closeWhenDone(store, context, metrics)
    store
  }

  /**
   * Adds a row to each store (`indexKeys` its key, bound to `inputOutput`) whose key for it has no
   * NULL (NULL never equals anything).
   */
  def adder(stores: Seq[AppendableStore], indexKeys: Seq[Seq[Expression]],
      inputOutput: Seq[Attribute]): InternalRow => Unit = {
    val keyOf = indexKeys.map(keys => UnsafeProjection.create(keys))
    val toUnsafe = UnsafeProjection.create(inputOutput, inputOutput)
    row => {
      val unsafe = row match {
        case u: UnsafeRow => u
        case other => toUnsafe(other)
      }
      keyOf.indices.foreach { i =>
        val key = keyOf(i)(unsafe)
        if (!key.anyNull) stores(i).add(key, unsafe)
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
