package umjoin.spark.core.store

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.UnsafeRow

/**
 * One input's rows, indexed by its join key: what a UMJoin probes. A key is an UnsafeRow of the
 * store's key types; rows whose key has a NULL were never stored, since NULL never equals anything.
 */
trait JoinStore extends AutoCloseable {
  /**
   * The rows stored under `key` (no NULL in it); empty if none. Rows stay valid until the next
   * `get`.
   */
  def get(key: UnsafeRow): Iterator[InternalRow]
  /**
   * True when no key has more than one row: then `getOne` finds every match without an iterator.
   */
  def keysAreUnique: Boolean = false
  /** The row stored under `key`, or null; for stores whose keys are unique. */
  def getOne(key: UnsafeRow): InternalRow =
    throw new UnsupportedOperationException("a store with repeated keys has no single row per key")
  /**
   * `get` of a key of one LongType column, given as its value. Spark's long-keyed hash map finds it
   * without a key row; other stores get the value in a row of their own (`longKey`).
   */
  def getLong(key: Long): Iterator[InternalRow] = get(longKey(key))
  /** `getOne` of a key of one LongType column, given as its value. */
  def getOneLong(key: Long): InternalRow = getOne(longKey(key))
  // The key row of `getLong`: the store's own, as a lookup reads its key only until it returns
  // (the generated batch probe, its one caller, has stores of its own task).
  private[this] val longKeyRow = new UnsafeRow(1)
  longKeyRow.pointTo(new Array[Byte](16), 16)
  private def longKey(key: Long): UnsafeRow = {
    longKeyRow.setLong(0, key)
    longKeyRow
  }
  def isEmpty: Boolean
  def sizeInBytes: Long
  /**
   * Its keys, or its rows where the store does not count keys: the kappa of the probe cost model.
   */
  def keyCount: Long
}

/**
 * A store rows can be added to at any time, also between probes (rows arriving one by one);
 * `keysAreUnique` holds for the rows added so far.
 */
trait AppendableStore extends JoinStore {
  /** Adds `row` under `key` (no NULL in it). */
  def add(key: UnsafeRow, row: UnsafeRow): Unit
}
