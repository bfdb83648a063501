package umjoin.spark.streaming

import java.util.UUID

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Expression, UnsafeRow}
import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo

import umjoin.spark.core.LeastRecentlyUsed
import umjoin.spark.core.cost.{CacheModel, KeyStatistics, StaticCacheMode, StaticCacheSettings,
  StreamRateForecast}
import umjoin.spark.core.probe.StoreIndex
import umjoin.spark.core.store.{JoinStore, SmallStore}

/**
 * What an executor keeps in memory of the stored static tables of running StreamingUMJoins
 * (spark.umjoin.staticCache), per query run, operator, partition and input. A cache holds rows of
 * one load of the table ([[StaticVersions]]'s generation) and is dropped when a later load
 * replaces it, after ten idle minutes (an executor never hears that a query ended), and, the least
 * recently used first, when the caches of the executor would hold more than a tenth of its heap.
 */
object StaticCaches {
  final case class Key(runId: UUID, operatorId: Long, partition: Int, input: Int)
  private val IdleMs = 10L * 60 * 1000
  private val caches = new LeastRecentlyUsed[Key, StaticInputCache](maxEntries = Int.MaxValue,
    maxWeight = Runtime.getRuntime.maxMemory / 10, weight = _.cachedBytes)

  /**
   * The cache of load `generation` of the input's table in this partition, empty if there is none
   * yet.
   */
  def of(info: StatefulOperatorStateInfo, partition: Int, input: Int, generation: Long,
      create: => StaticInputCache): StaticInputCache = {
    val now = System.currentTimeMillis()
    caches.removeIf(_.idleSince(now) > IdleMs)
    val cache = caches.update(Key(info.queryRunId, info.operatorId, partition, input), {
      case Some(old) if old.generation == generation => old
      case _ => create
    })
    cache.touch(now)
    cache
  }

  /** The cache of that load, if this executor has one (for its metrics). */
  def existing(info: StatefulOperatorStateInfo, partition: Int, input: Int,
      generation: Long): Option[StaticInputCache] =
    caches.get(Key(info.queryRunId, info.operatorId, partition, input))
      .filter(_.generation == generation)
}

/**
 * One partition's cache of one load of a stored static table.
 *
 * `ssbj` (SSBJ paper 003): the rows of whole keys of the table's partitioning index, chosen after
 * every micro-batch by [[CacheModel]] from m(j), the key's rows in the store (counted when a probe
 * reads them), and n(j), the probes of the key per batch forecast from the batches before
 * ([[StreamRateForecast]]). A key the table lacks is cached as an empty entry, at no cost. Probes
 * through other indexes read the store.
 * `all`: every row, indexed by every index of the store, read once from the store; if the rows pass
 * `maxBytes`, nothing (the store is probed).
 *
 * @param indexKeys        per index of the store, its key bound to the table's rows
 * @param masterRowBytes   v_R before any row is measured (from the table's schema)
 * @param streamRowBytes   v_S: the rows that probe the table (from their schema)
 */
final class StaticInputCache(
    val generation: Long,
    settings: StaticCacheSettings,
    partitionIndex: StoreIndex,
    indexKeys: Map[StoreIndex, Seq[Expression]],
    masterRowBytes: Double,
    streamRowBytes: Double) {

  @volatile private var lastUsed = System.currentTimeMillis()
  private[streaming] def touch(now: Long): Unit = lastUsed = now
  private[streaming] def idleSince(now: Long): Long = now - lastUsed

  // ssbj: cached keys and their rows, the rows per key seen in the store, the probes per key this
  // batch.
  private val cached = new java.util.HashMap[UnsafeRow, Array[UnsafeRow]]()
  private val masterRows = new java.util.HashMap[UnsafeRow, java.lang.Long]()
  private val probes = new java.util.HashMap[UnsafeRow, Array[Long]]()
  private val forecast = new StreamRateForecast[UnsafeRow](StaticInputCache.ForecastSmoothing)
  private var measuredRows = 0L
  private var measuredBytes = 0L
  // all: every row by index, once read (None: not read yet; Some(empty): too large for the bound).
  private var whole: Option[Map[StoreIndex, SmallStore]] = None
  private var bytes = 0L

  def cachedKeys: Long = synchronized(whole match {
    case Some(tables) => tables.get(partitionIndex).map(_.keyCount).getOrElse(0L)
    case None => cached.size.toLong
  })
  def cachedBytes: Long = synchronized(bytes)

  /**
   * Probes of the table through `index` as the probe loop sees them: from the cache where it holds
   * the key, else from `store` (the committed store), counted as `hits` and `misses`.
   */
  def view(index: StoreIndex, store: JoinStore, allRows: () => Iterator[InternalRow],
      hits: SQLMetric, misses: SQLMetric): JoinStore =
    settings.mode match {
      case StaticCacheMode.Off => new StaticInputCache.Counted(store, misses)
      case StaticCacheMode.All =>
        synchronized(if (whole.isEmpty) whole = Some(readAll(allRows())))
        whole.get.get(index) match {
          case Some(table) => new StaticInputCache.Counted(table, hits)
          case None => new StaticInputCache.Counted(store, misses)
        }
      case StaticCacheMode.Ssbj if index == partitionIndex => new JoinStore {
        override def get(key: UnsafeRow): Iterator[InternalRow] =
          StaticInputCache.this.synchronized {
            val counter = probes.get(key)
            if (counter == null) probes.put(key.copy(), Array(1L)) else counter(0) += 1
            val rows = cached.get(key)
            if (rows != null) {
              hits += 1
              rows.iterator
            } else {
              misses += 1
              val seen = key.copy()
              var rows = 0L
              StageTask.whenDone(store.get(key).map { row => rows += 1; row },
                () => StaticInputCache.this.synchronized(masterRows.put(seen, rows)))
            }
          }
        override def isEmpty: Boolean = false
        override def keyCount: Long = store.keyCount
        override def sizeInBytes: Long = 0L
        override def close(): Unit = ()
      }
      case StaticCacheMode.Ssbj => new StaticInputCache.Counted(store, misses)
    }

  /**
   * After a micro-batch (ssbj): n(j) forecast again from this batch's probes, the keys chosen
   * again, and keys moved as a whole: a key entering is read from `store` (the table's partitioning
   * index).
   */
  def endBatch(store: JoinStore): Unit = if (settings.mode == StaticCacheMode.Ssbj) synchronized {
    forecast.observe(probes.asScala.map { case (k, n) => k -> n(0) })
    probes.clear()
    masterRows.keySet.retainAll(forecast.keys.asJava)
    val statistics = forecast.keys.toSeq.flatMap(k =>
      Option(masterRows.get(k)).map(m => KeyStatistics(k, m.longValue, forecast.rate(k))))
    val rowBytes = if (measuredRows > 0) measuredBytes.toDouble / measuredRows else masterRowBytes
    val model = CacheModel(rowBytes, streamRowBytes, settings.hysteresis, settings.maxBytes)
    val chosen = model.choose(statistics, (k: UnsafeRow) => cached.containsKey(k))
    cached.entrySet.removeIf { e =>
      val leaves = !chosen(e.getKey)
      if (leaves) bytes -= StaticInputCache.entryBytes(e.getKey, e.getValue)
      leaves
    }
    chosen.filterNot(cached.containsKey).foreach { k =>
      val rows = store.get(k).map(_.asInstanceOf[UnsafeRow].copy()).toArray
      measuredRows += rows.length
      measuredBytes += rows.map(_.getSizeInBytes.toLong).sum
      cached.put(k, rows)
      bytes += StaticInputCache.entryBytes(k, rows)
    }
  }

  /** Every row by every index, or no index if their bytes pass `maxBytes` (reading stops there). */
  private def readAll(rows: Iterator[InternalRow]): Map[StoreIndex, SmallStore] = {
    val copies = mutable.ArrayBuffer[UnsafeRow]()
    var rowBytes = 0L
    while (rowBytes <= settings.maxBytes && rows.hasNext) {
      val copy = rows.next().asInstanceOf[UnsafeRow].copy()
      copies += copy
      rowBytes += copy.getSizeInBytes
    }
    val (indexes, keys) = indexKeys.toSeq.unzip
    val tables = if (rowBytes > settings.maxBytes) Nil else SmallStore.build(copies.toSeq, keys)
    // Each index counts the rows as its own: an upper bound of what they share.
    val used = tables.map(_.sizeInBytes).sum
    if (tables.isEmpty || used > settings.maxBytes) Map.empty
    else {
      bytes = used
      indexes.zip(tables).toMap
    }
  }
}

private object StaticInputCache {
  /** The weight of this batch's probes in n(j): half, the rest from the batches before. */
  val ForecastSmoothing = 0.5

  def entryBytes(key: UnsafeRow, rows: Array[UnsafeRow]): Long =
    SmallStore.EntryOverhead + key.getSizeInBytes + rows.map(_.getSizeInBytes.toLong + 8).sum

  /** `store`, each probe counted in `probes`. */
  final class Counted(store: JoinStore, probes: SQLMetric) extends JoinStore {
    override def get(key: UnsafeRow): Iterator[InternalRow] = {
      probes += 1
      store.get(key)
    }
    override def isEmpty: Boolean = store.isEmpty
    override def keyCount: Long = store.keyCount
    override def sizeInBytes: Long = store.sizeInBytes
    override def close(): Unit = ()
  }
}
