package umjoin.spark.exec

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression, GenericInternalRow, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.state.{PrefixKeyScanStateEncoderSpec, ReadStateStore, StateStore, StateStoreConf, StateStoreId, StateStoreProviderId}
import org.apache.spark.sql.types.{DataType, LongType, StructField, StructType}

import umjoin.spark.state.JoinStore

/**
 * Where one stream input of a streaming UMJoin keeps its rows, in one partition: a state store
 * keyed by (the row's value of its partitioning class, a sequence number, the time it was stored),
 * probed by prefix scans on the first; and per further indexed class a state store keyed by (the
 * row's value of that class, the sequence number), whose values point to the row (its partitioning
 * key and time). All of them under the StreamingUMJoin's operator in the checkpoint, through Spark's
 * state store API, so the session's provider (RocksDB's is an LSM-tree) keeps them.
 *
 * @param partitionKey the input's expression for its partitioning class
 * @param indexKeys    per indexed class, the input's expression for it
 */
final case class InputStateSpec(input: Int, output: Seq[Attribute], partitionKey: Expression, indexKeys: Seq[(Int, Expression)]) {
  def primaryKeySchema: StructType = StructType(Seq(
    StructField("key", partitionKey.dataType), StructField("sequence", LongType, nullable = false), StructField("storedAtMs", LongType, nullable = false)))
  def indexKeySchema(key: Expression): StructType = StructType(Seq(StructField("key", key.dataType), StructField("sequence", LongType, nullable = false)))
  def indexValueSchema: StructType = StructType(Seq(StructField("partitionKey", partitionKey.dataType), StructField("storedAtMs", LongType, nullable = false)))
}

/**
 * The stores of one stream input in one task, for reading: the version the previous micro-batch
 * committed (`writer` is set in the task that writes this batch's version). A stored row is seen
 * only while `visible` holds for the time it was stored (spark.umjoin.stateTtl).
 */
final class InputState private (
    spec: InputStateSpec,
    val primary: ReadStateStore,
    val indexes: Map[Int, ReadStateStore],
    visible: Long => Boolean) {

  private val rowKey = UnsafeProjection.create(spec.primaryKeySchema.map(_.dataType).toArray)
  private val rowKeyValues = new GenericInternalRow(3)

  /** The stored rows whose value of class `keyClass` is the single field of `key`. */
  def lookup(keyClass: Int, key: UnsafeRow): Iterator[InternalRow] =
    indexes.get(keyClass) match {
      case None => primary.prefixScan(key).filter(pair => visible(pair.key.getLong(2))).map(_.value)
      case Some(index) => index.prefixScan(key).filter(pair => visible(pair.value.getLong(1))).map { pair =>
        rowKeyValues.update(0, pair.value.get(0, spec.partitionKey.dataType))
        rowKeyValues.update(1, pair.key.getLong(1))
        rowKeyValues.update(2, pair.value.getLong(1))
        val row = primary.get(rowKey(rowKeyValues))
        if (row == null) throw new IllegalStateException(
          s"UMJoin state of input #${spec.input}: an index entry points to a row that is not stored; the checkpoint's state is inconsistent")
        row
      }
    }

  /** Every stored row still visible. */
  def visibleRows(): Iterator[InternalRow] = primary.iterator().filter(pair => visible(pair.key.getLong(2))).map(_.value)

  /** A probe of this input's state through `keyClass`, as the probe loop sees it. */
  def storeFor(keyClass: Int): JoinStore = new JoinStore {
    override def get(key: UnsafeRow): Iterator[InternalRow] = lookup(keyClass, key)
    override def isEmpty: Boolean = false // unknown without a scan; probing an empty store is cheap
    override def keyCount: Long = primary match {
      case s: StateStore => s.metrics.numKeys
      case _ => 0L
    }
    override def sizeInBytes: Long = 0L
    override def close(): Unit = ()
  }
}

object InputState {
  def storeName(input: Int): String = s"umjoin-input-$input"
  def indexStoreName(input: Int, position: Int): String = s"umjoin-input-$input-index-$position"

  /** The committed state of the previous micro-batch, read-only; released when the task ends. */
  def read(spec: InputStateSpec, info: StatefulOperatorStateInfo, partition: Int, conf: StateStoreConf, hadoopConf: Configuration,
      visible: Long => Boolean, context: TaskContext): InputState = {
    def open(name: String, keySchema: StructType, valueSchema: StructType): ReadStateStore = {
      val store = StateStore.getReadOnly(providerId(info, partition, name), keySchema, valueSchema, PrefixKeyScanStateEncoderSpec(keySchema, 1),
        info.storeVersion, None, None, false, conf, hadoopConf)
      context.addTaskCompletionListener[Unit](_ => store.release())
      store
    }
    new InputState(spec,
      open(storeName(spec.input), spec.primaryKeySchema, DataTypeUtils.fromAttributes(spec.output)),
      spec.indexKeys.zipWithIndex.map { case ((c, key), position) =>
        c -> open(indexStoreName(spec.input, position), spec.indexKeySchema(key), spec.indexValueSchema)
      }.toMap,
      visible)
  }

  /** The state to write this micro-batch's version of; aborted when the task ends without committing. */
  def write(spec: InputStateSpec, info: StatefulOperatorStateInfo, partition: Int, conf: StateStoreConf, hadoopConf: Configuration,
      visible: Long => Boolean, context: TaskContext): InputStateWriter = {
    def open(name: String, keySchema: StructType, valueSchema: StructType): StateStore = {
      val store = StateStore.get(providerId(info, partition, name), keySchema, valueSchema, PrefixKeyScanStateEncoderSpec(keySchema, 1),
        info.storeVersion, None, None, false, conf, hadoopConf)
      context.addTaskCompletionListener[Unit](_ => if (!store.hasCommitted) store.abort())
      store
    }
    val primary = open(storeName(spec.input), spec.primaryKeySchema, DataTypeUtils.fromAttributes(spec.output))
    val indexes = spec.indexKeys.zipWithIndex.map { case ((c, key), position) =>
      c -> open(indexStoreName(spec.input, position), spec.indexKeySchema(key), spec.indexValueSchema)
    }.toMap
    new InputStateWriter(spec, primary, indexes, new InputState(spec, primary, indexes, visible), info.storeVersion)
  }

  private def providerId(info: StatefulOperatorStateInfo, partition: Int, name: String): StateStoreProviderId =
    StateStoreProviderId(StateStoreId(info.checkpointLocation, info.operatorId, partition, name), info.queryRunId)
}

/** Writes one micro-batch's changes to a stream input's stores in one partition, then commits them. */
final class InputStateWriter(spec: InputStateSpec, val primary: StateStore, indexes: Map[Int, StateStore], val state: InputState, version: Long) {
  private val partitionKeyOf = UnsafeProjection.create(Seq(spec.partitionKey), spec.output)
  private val indexKeyOf = spec.indexKeys.map { case (c, key) => c -> UnsafeProjection.create(Seq(key), spec.output) }.toMap
  private val toStored = UnsafeProjection.create(spec.output, spec.output)
  private val rowKey = UnsafeProjection.create(spec.primaryKeySchema.map(_.dataType).toArray)
  private val indexKey = spec.indexKeys.map { case (c, key) => c -> UnsafeProjection.create(spec.indexKeySchema(key).map(_.dataType).toArray) }.toMap
  private val indexValue = UnsafeProjection.create(spec.indexValueSchema.map(_.dataType).toArray)
  private val values3 = new GenericInternalRow(3)
  private val values2 = new GenericInternalRow(2)
  // Unique within the partition: the batch in the high bits, the row's place in it in the low ones.
  private var sequence = version << 32

  /** Stores a row that arrived (its keys have no NULL), as of `nowMs`. */
  def put(row: InternalRow, nowMs: Long): Unit = {
    val partitionKey = partitionKeyOf(row).get(0, spec.partitionKey.dataType)
    values3.update(0, partitionKey)
    values3.update(1, sequence)
    values3.update(2, nowMs)
    primary.put(rowKey(values3), toStored(row))
    indexes.foreach { case (c, store) =>
      values2.update(0, indexKeyOf(c)(row).get(0, dataTypeOf(c)))
      values2.update(1, sequence)
      val key = indexKey(c)(values2).copy()
      values2.update(0, partitionKey)
      values2.update(1, nowMs)
      store.put(key, indexValue(values2))
    }
    sequence += 1
  }

  /** Removes every stored row `gone(storedAtMs, row)` selects, with its index entries; returns how many. */
  def removeWhere(gone: (Long, UnsafeRow) => Boolean): Long = {
    val doomed = mutable.ArrayBuffer[(UnsafeRow, UnsafeRow)]()
    primary.iterator().foreach(pair => if (gone(pair.key.getLong(2), pair.value)) doomed += ((pair.key.copy(), pair.value.copy())))
    doomed.foreach { case (key, row) =>
      primary.remove(key)
      indexes.foreach { case (c, store) =>
        values2.update(0, indexKeyOf(c)(row).get(0, dataTypeOf(c)))
        values2.update(1, key.getLong(1))
        store.remove(indexKey(c)(values2))
      }
    }
    doomed.size.toLong
  }

  def commit(): Unit = {
    primary.commit()
    indexes.values.foreach(_.commit())
  }

  /** The stores beside the rows: the indexes. */
  def auxiliary: Seq[StateStore] = indexes.toSeq.sortBy(_._1).map(_._2)
  def stores: Seq[StateStore] = primary +: auxiliary
  def rowCount: Long = primary.metrics.numKeys
  def indexEntryCount: Long = indexes.values.map(_.metrics.numKeys).sum
  def memoryBytes: Long = stores.map(_.metrics.memoryUsedBytes).sum

  private def dataTypeOf(c: Int): DataType = spec.indexKeys.collectFirst { case (`c`, key) => key.dataType }.get
}

/**
 * The rows each stream input's store held in a partition when a task of this executor committed
 * it, by version: the next micro-batch's tasks, which the state store's locality mostly brings back
 * here, learn without a scan whether a store is small enough to read into memory (a store cannot be
 * asked before it is committed). A task elsewhere finds nothing and probes the store.
 */
object CommittedRowCounts {
  private final case class Key(checkpoint: String, operator: Long, partition: Int, input: Int)
  private val counts = new java.util.concurrent.ConcurrentHashMap[Key, (Long, Long)]()

  def record(info: StatefulOperatorStateInfo, partition: Int, input: Int, version: Long, rows: Long): Unit = {
    if (counts.size > 100000) counts.clear() // queries come and go; a forgotten count only costs a probe of the store
    counts.put(Key(info.checkpointLocation, info.operatorId, partition, input), (version, rows))
  }

  /** The rows of the version this micro-batch reads, if this executor committed it. */
  def of(info: StatefulOperatorStateInfo, partition: Int, input: Int): Option[Long] =
    Option(counts.get(Key(info.checkpointLocation, info.operatorId, partition, input))).collect {
      case (version, rows) if version == info.storeVersion => rows
    }
}
