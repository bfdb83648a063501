package umjoin.spark.core.store

import java.util.{HashMap => JHashMap}

import scala.collection.mutable.ArrayBuffer

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression,
  UnsafeProjection, UnsafeRow}

/**
 * A partition's rows that fit in `SmallStore.MaxBytes`, in a JVM hash map. Spark's hash maps take a
 * whole memory page of the task (up to 64 MB) however few rows they hold; a multi-way join builds
 * one per input and index, so tiny inputs made a task hold hundreds of MB and fail for lack of
 * memory. Keys compare as bytes, as in Spark's UnsafeHashedRelation.
 */
final class SmallStore private (map: JHashMap[UnsafeRow, ArrayBuffer[UnsafeRow]],
    override val sizeInBytes: Long, unique: Boolean) extends JoinStore {
  override def get(key: UnsafeRow): Iterator[InternalRow] = {
    val rows = map.get(key)
    if (rows == null) Iterator.empty else rows.iterator
  }
  override def keysAreUnique: Boolean = unique
  override def getOne(key: UnsafeRow): InternalRow = {
    val rows = map.get(key)
    if (rows == null) null else rows(0)
  }
  override def isEmpty: Boolean = map.isEmpty
  override def keyCount: Long = map.size.toLong
  override def close(): Unit = ()
}

object SmallStore {
  /** The most row bytes a small store holds: what the smallest page of Spark's own maps holds. */
  val MaxBytes: Long = 1L << 20

  /**
   * What a key's entry in a JVM hash map costs beyond the key's and rows' bytes: the map's node,
   * the key object, the rows' buffer.
   */
  val EntryOverhead = 96L

  /**
   * Small stores of `rows` if their bytes fit in `MaxBytes`, else `larger`'s stores of them all
   * (`indexKeys` bound to `inputOutput`; rows are handed over as UnsafeRows, converted where they
   * are not).
   */
  def buildOr(rows: Iterator[InternalRow],
      indexKeys: Seq[Seq[Expression]], inputOutput: Seq[Attribute])(
          larger: Iterator[UnsafeRow] => Seq[JoinStore]): Seq[JoinStore] = {
    // Spark's maps copy UnsafeRow bytes; most operators already produce UnsafeRows.
    lazy val toUnsafe = UnsafeProjection.create(inputOutput, inputOutput)
    val unsafeRows = rows.map {
      case u: UnsafeRow => u
      case other => toUnsafe(other)
    }
    val first = ArrayBuffer[UnsafeRow]()
    var firstBytes = 0L
    while (firstBytes <= MaxBytes && unsafeRows.hasNext) {
      val row = unsafeRows.next().copy()
      first += row
      firstBytes += row.getSizeInBytes
    }
    if (firstBytes <= MaxBytes) build(first.toSeq, indexKeys)
    else {
      val all = first.iterator ++ unsafeRows
      try larger(all) finally first.clear()
    }
  }

  /**
   * One store per index (`indexKeys`, bound to the rows); rows (copies, owned by the caller) whose
   * key has a NULL are left out.
   */
  def build(rows: Seq[UnsafeRow], indexKeys: Seq[Seq[Expression]]): Seq[SmallStore] =
    indexKeys.map { keys =>
      val keyOf = UnsafeProjection.create(keys)
      val map = new JHashMap[UnsafeRow, ArrayBuffer[UnsafeRow]]()
      var bytes = 0L
      var unique = true
      rows.foreach { row =>
        val key = keyOf(row)
        if (!key.anyNull) {
          val same = map.get(key)
          if (same == null) {
            map.put(key.copy(), ArrayBuffer(row))
            bytes += EntryOverhead + key.getSizeInBytes
          } else {
            same += row
            unique = false
          }
          bytes += row.getSizeInBytes + 8
        }
      }
      new SmallStore(map, bytes, unique)
    }
}
