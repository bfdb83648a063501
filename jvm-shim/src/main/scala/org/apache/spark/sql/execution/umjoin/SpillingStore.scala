// Lives beside InMemoryStore: a task's memory manager is private to Spark.
package org.apache.spark.sql.execution.umjoin

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.unsafe.map.BytesToBytesMap

import umjoin.spark.core.store.{AppendableStore, RocksDBStore}

/**
 * `auto`: a store in Spark's BytesToBytesMap (the map behind Spark's hashed relations, in memory
 * granted by the task's memory manager) until that memory manager refuses to let it grow, or it
 * holds more than `maxMemory` bytes. Then every row moves to a RocksDB store, and the rest of the
 * input follows. Nothing is lost and the task does not fail for lack of memory.
 */
final class SpillingStore(context: TaskContext, numFields: Int, maxMemory: Long,
    newDiskStore: () => RocksDBStore) extends AppendableStore {
  // Pages of at most 1 MB (PagedStore's): Spark's page size (up to 64 MB) would make every store,
  // even of a 25-row table, hold 64 MB of the task's memory. A larger row gets a page of its own
  // size.
  private var map = new BytesToBytesMap(context.taskMemoryManager(), 64,
    math.min(PagedStore.PageBytes, context.taskMemoryManager().pageSizeBytes()))
  private var disk: RocksDBStore = _
  private var rows = 0L
  private var repeatedKey = false
  private val row = new UnsafeRow(numFields)

  /** The RocksDB store the rows moved to, once they did. */
  def diskStore: Option[RocksDBStore] = Option(disk)

  override def add(key: UnsafeRow, value: UnsafeRow): Unit = {
    rows += 1
    if (disk == null) {
      val location = map.lookup(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes)
      repeatedKey ||= location.isDefined
      val added = location.append(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes,
        value.getBaseObject, value.getBaseOffset, value.getSizeInBytes)
      // getUsed is the memory the map took from the task (pages and array);
      // getTotalMemoryConsumption would sum the same by walking every page, at each row.
      if (added && map.getUsed <= maxMemory) return
      moveToDisk()
      if (added) return
    }
    disk.add(key, value)
  }

  private def moveToDisk(): Unit = {
    disk = newDiskStore()
    val entries = map.iterator()
    while (entries.hasNext) {
      val e = entries.next()
      disk.add(e.getKeyBase, e.getKeyOffset, e.getKeyLength, e.getValueBase, e.getValueOffset,
        e.getValueLength)
    }
    map.free()
    map = null
  }

  override def get(key: UnsafeRow): Iterator[InternalRow] =
    if (disk != null) disk.get(key)
    else
      PagedStore.rowsAt(map.lookup(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes), row)

  // A batch task reads this once its stores are built; a store that moved to RocksDB takes the
  // iterator path.
  override def keysAreUnique: Boolean = disk == null && !repeatedKey

  override def getOne(key: UnsafeRow): InternalRow =
    PagedStore.rowAt(map.lookup(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes), row)

  override def isEmpty: Boolean = rows == 0
  override def keyCount: Long = rows
  override def sizeInBytes: Long =
    if (disk != null) disk.sizeInBytes else if (map != null) map.getUsed else 0L

  /** Frees the map's memory (and closes the RocksDB store); closing again does nothing. */
  override def close(): Unit = {
    if (map != null) map.free()
    map = null
    if (disk != null) disk.close()
  }
}
