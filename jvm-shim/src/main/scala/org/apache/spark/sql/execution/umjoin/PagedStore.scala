// A task's memory manager is private to Spark (see InMemoryStore).
package org.apache.spark.sql.execution.umjoin

import scala.collection.mutable

import org.apache.spark.TaskContext
import org.apache.spark.memory.TaskMemoryManager
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression,
  UnsafeProjection, UnsafeRow}
import org.apache.spark.unsafe.map.BytesToBytesMap

import umjoin.spark.core.store.{JoinStore, SmallStore}

/**
 * Rows in Spark's BytesToBytesMap (several rows per key), in pages of [[PagedStore.PageBytes]]
 * granted by the task's memory manager, freed when the store is closed. Spark's hash relations take
 * a page of spark.buffer.pageSize (by default up to 64 MB, from the executor's memory) however few
 * rows they hold, the JVM allocates arrays that large outside its young generation, and Spark keeps
 * freed pages of 1 MB and more for reuse. A streaming task indexes each micro-batch's rows of an
 * input, a few MB: with Spark's maps a task held a 64 MB array per index and the heap grew around
 * them (the TPC-H Q3 block at SF 1: 70 such regions of 2 MB live through the run; the heap's peak
 * use 1.0-1.5 GB, 0.6-0.7 GB with pages of 1 MB).
 * Keys compare as bytes, as in Spark's UnsafeHashedRelation.
 */
final class PagedStore private (map: BytesToBytesMap, numFields: Int) extends JoinStore {
  private val row = new UnsafeRow(numFields) // (a store's rows stay valid until its next lookup)

  override def get(key: UnsafeRow): Iterator[InternalRow] =
    PagedStore.rowsAt(map.lookup(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes), row)
  override def keysAreUnique: Boolean = map.numKeys == map.numValues
  override def getOne(key: UnsafeRow): InternalRow =
    PagedStore.rowAt(map.lookup(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes), row)
  override def isEmpty: Boolean = map.numValues == 0
  override def sizeInBytes: Long = map.getTotalMemoryConsumption
  override def keyCount: Long = map.numKeys.toLong
  override def close(): Unit = map.free()
}

object PagedStore {
  /**
   * A page's bytes: the JVM array holding it is then exactly 1 MB, which G1 allocates among young
   * objects wherever its regions are 2 MB or larger (heaps of 4 GB and more) and in one region of
   * its own on smaller heaps; Spark pools no array below 1 MB, so the page is garbage once freed.
   * A task has at most 8192 pages, so one task's stores hold at most about 8 GB.
   */
  val PageBytes: Long = (1L << 20) - 16

  /** The rows stored under the key `location` found (none if it found nothing), each in `row`. */
  def rowsAt(location: BytesToBytesMap#Location,
      row: UnsafeRow): Iterator[InternalRow] = new Iterator[InternalRow] {
    private var more = location.isDefined
    override def hasNext: Boolean = more
    override def next(): InternalRow = {
      row.pointTo(location.getValueBase, location.getValueOffset, location.getValueLength)
      more = location.nextValue()
      row
    }
  }

  /** The first row stored under the key `location` found, in `row`; null if it found nothing. */
  def rowAt(location: BytesToBytesMap#Location, row: UnsafeRow): InternalRow =
    if (!location.isDefined) null
    else {
      row.pointTo(location.getValueBase, location.getValueOffset, location.getValueLength)
      row
    }

  /**
   * One store per index (`indexKeys`, bound to `inputOutput`) of `rows`, those whose key has no
   * NULL: in JVM maps while they fit in [[SmallStore.MaxBytes]], else in paged maps (the first
   * index's reads the rows, the others read it). Closed when the task ends.
   */
  def build(rows: Iterator[InternalRow], indexKeys: Seq[Seq[Expression]],
      inputOutput: Seq[Attribute], context: TaskContext): Seq[JoinStore] =
    SmallStore.buildOr(rows, indexKeys, inputOutput) { all =>
      val memory = context.taskMemoryManager()
      val maps = mutable.ArrayBuffer[BytesToBytesMap]()
      try {
        maps += filled(all, indexKeys.head, memory)
        indexKeys.tail.foreach(keys =>
          maps += filled(valuesOf(maps.head, inputOutput.size), keys, memory))
      } catch {
        case e: Throwable =>
          maps.foreach(_.free())
          throw e
      }
      val stores = maps.toSeq.map(new PagedStore(_, inputOutput.size))
      stores.foreach(store => context.addTaskCompletionListener[Unit](_ => store.close()))
      stores
    }

  /** Every row of `map`, in one reused UnsafeRow. */
  private def valuesOf(table: BytesToBytesMap,
      numFields: Int): Iterator[UnsafeRow] = new Iterator[UnsafeRow] {
    private val records = table.iterator()
    private val row = new UnsafeRow(numFields)
    override def hasNext: Boolean = records.hasNext
    override def next(): UnsafeRow = {
      val at = records.next()
      row.pointTo(at.getValueBase, at.getValueOffset, at.getValueLength)
      row
    }
  }

  private def filled(rows: Iterator[UnsafeRow], keys: Seq[Expression],
      memory: TaskMemoryManager): BytesToBytesMap = {
    val keyOf = UnsafeProjection.create(keys)
    val map = new BytesToBytesMap(memory, 64, PageBytes)
    try {
      rows.foreach { row =>
        val key = keyOf(row)
        if (!key.anyNull) {
          val at = map.lookup(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes)
          if (!at.append(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes,
              row.getBaseObject, row.getBaseOffset, row.getSizeInBytes))
            throw new IllegalStateException(
              s"UMJoin: the task's memory manager refused memory for ${map.numValues + 1} rows " +
                s"(${map.getTotalMemoryConsumption >> 20}" +
                " MB) of an input indexed in memory. Give the executors more memory " +
                ("(spark.executor.memory, spark.memory.fraction) or spread the rows over more " +
                  "partitions"))
        }
      }
      map
    } catch {
      case e: Throwable =>
        map.free()
        throw e
    }
  }
}
