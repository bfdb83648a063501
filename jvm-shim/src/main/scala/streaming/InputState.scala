package umjoin.spark.streaming

import scala.collection.mutable

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeReference, Expression,
  GenericInternalRow, JoinedRow, SpecificInternalRow, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec,
  NoPrefixKeyStateEncoderSpec, PrefixKeyScanStateEncoderSpec, StateStore, StateStoreConf}
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.{DataType, LongType, StructField, StructType}

import umjoin.spark.core.{GeneratedCode, JoinGraph, LeastRecentlyUsed}
import umjoin.spark.core.probe.StoreIndex
import umjoin.spark.core.store.JoinStore

/**
 * Where one stream input of a streaming UMJoin keeps its rows, in one partition: a state store
 * keyed by (the row's value of its partitioning class, a sequence number, the time it was stored),
 * probed by prefix scans on the first; and per further index a state store keyed by (the row's
 * values of the index's classes, the sequence number), probed by prefix scans on those values,
 * whose values point to the row (its partitioning key and time). All of them under the
 * StreamingUMJoin's operator in the checkpoint, through Spark's state store API, so the session's
 * provider (RocksDB's is an LSM-tree) keeps them.
 *
 * @param partitionClass the key class the input is partitioned on, and `partitionKey` its
 *                       expression for it
 * @param indexes        per index, the input's expressions for its classes
 * @param name           the rows' store's name (its indexes' names start with it):
 *                       [[InputState.storeName]] for an input's own rows,
 *                       [[InputState.unmatchedStoreName]] for the combinations an outer join waits
 *                       to match
 */
final case class InputStateSpec(input: Int, output: Seq[Attribute], partitionClass: Int,
    partitionKey: Expression, indexes: Seq[(StoreIndex, Seq[Expression])], name: String) {
  def indexKeySchema(keys: Seq[Expression]): StructType =
    StructType(keys.zipWithIndex.map { case (k, i) =>
      StructField(if (i == 0) "key" else s"key$i", k.dataType)
    } :+ StructField("sequence", LongType, nullable = false))
  def indexValueSchema: StructType = StructType(Seq(StructField("partitionKey",
    partitionKey.dataType), StructField("storedAtMs", LongType, nullable = false)))
  /**
   * Every index the input's rows can be probed through: its partitioning class, then the further
   * indexes.
   */
  def allIndexes: Seq[(StoreIndex, Seq[Expression])] =
    (StoreIndex.single(partitionClass) -> Seq(partitionKey)) +: indexes
  /** The rows' store: one entry per row, or (`listed`) per partitioning key, holding its rows. */
  def rowStore(listed: Boolean): StoreSchema = InputStateSpec.rowStore(name,
    partitionKey.dataType, DataTypeUtils.fromAttributes(output), listed)
  /** Per further index (in the order of `indexes`), its store. */
  def indexStores: Seq[StoreSchema] = indexes.zipWithIndex.map { case ((_, keys), position) =>
    StoreSchema(InputState.indexStoreName(name, position), indexKeySchema(keys), indexValueSchema)
  }
}

object InputStateSpec {
  /** The key of an input's rows' store: its partitioning key's value, a sequence number, a time. */
  def rowKeySchema(partitionKeyType: DataType): StructType = StructType(Seq(
    StructField("key", partitionKeyType), StructField("sequence", LongType, nullable = false),
    StructField("storedAtMs", LongType, nullable = false)))

  /**
   * An input's rows' store `name`: keyed by [[rowKeySchema]], each row its value; or (`listed`)
   * keyed by the partitioning key's value alone, each value of its list a row with its sequence
   * number and the time it was stored.
   */
  def rowStore(name: String, partitionKeyType: DataType, rowSchema: StructType,
      listed: Boolean): StoreSchema =
    if (listed) StoreSchema(name, StructType(Seq(StructField("key", partitionKeyType))),
      StructType(Seq(StructField("row", rowSchema, nullable = false),
        StructField("sequence", LongType, nullable = false),
        StructField("storedAtMs", LongType, nullable = false))), listed = true)
    else StoreSchema(name, rowKeySchema(partitionKeyType), rowSchema)

  /** Per input `layout` stores, where a partition keeps its rows. */
  def of(layout: StreamingLayout, graph: JoinGraph,
      outputs: IndexedSeq[Seq[Attribute]]): Map[Int, InputStateSpec] =
    layout.stored.map { j =>
      val c = layout.partitionClass(j).get
      j -> InputStateSpec(j, outputs(j), c, graph.classes(c).keyOf(j).get,
        layout.indexes(j).map(ix => ix -> ix.classes.map(c => graph.classes(c).keyOf(j).get)),
        InputState.storeName(j))
    }.toMap
}

/**
 * One state store of a stream input in each partition: its name and the schemas of its keys and
 * values; `listed`: each key holds a list of values (RocksDB's merge), looked up whole.
 */
final case class StoreSchema(name: String, keySchema: StructType, valueSchema: StructType,
    listed: Boolean = false) {
  def keyEncoding: KeyStateEncoderSpec =
    if (listed) NoPrefixKeyStateEncoderSpec(keySchema) else InputState.keyEncoding(keySchema)
}

/**
 * A stored row as a scan of an input's rows' store gives it: the row, its sequence number and when
 * it was stored. One instance is reused for every row of a scan.
 */
private[streaming] final class StoredRow {
  var row: UnsafeRow = _
  var sequence: Long = 0L
  var storedAtMs: Long = 0L
}

/**
 * An input's rows' store as the task reads it, in either of its keyings: an entry per row keyed by
 * (partitioning key, sequence number, time stored), or ([[StoreLayout.RowLists]]) an entry per
 * partitioning key holding that key's rows with their numbers.
 */
private[streaming] sealed trait StoredRows {
  /** The rows stored under partitioning key `key` (a row of its one value) still visible. */
  def withKey(key: UnsafeRow, visible: Long => Boolean): Iterator[InternalRow]
  /** The row an index entry points to, or null. */
  def pointedTo(partitionKey: Any, sequence: Long, storedAtMs: Long): InternalRow
  /** Every stored row (the same [[StoredRow]] each time, valid until the next). */
  def all(): Iterator[StoredRow]
}

private[streaming] object StoredRows {
  def apply(view: StoreView, schema: StoreSchema, partitionKeyType: DataType,
      rowFields: Int): StoredRows =
    if (schema.listed) new RowsPerKey(view, partitionKeyType, rowFields)
    else new RowPerEntry(view, partitionKeyType)

  private final class RowPerEntry(view: StoreView, keyType: DataType) extends StoredRows {
    private val rowKey = UnsafeProjection.create(Array(keyType, LongType, LongType))
    private val keyValues = new GenericInternalRow(3)
    override def withKey(key: UnsafeRow, visible: Long => Boolean): Iterator[InternalRow] =
      view.prefixScan(key).filter(pair => visible(pair.key.getLong(2))).map(_.value)
    override def pointedTo(partitionKey: Any, sequence: Long, storedAtMs: Long): InternalRow = {
      keyValues.update(0, partitionKey)
      keyValues.update(1, sequence)
      keyValues.update(2, storedAtMs)
      view.get(rowKey(keyValues))
    }
    override def all(): Iterator[StoredRow] = {
      val stored = new StoredRow
      view.iterator().map { pair =>
        stored.row = pair.value
        stored.sequence = pair.key.getLong(1)
        stored.storedAtMs = pair.key.getLong(2)
        stored
      }
    }
  }

  private final class RowsPerKey(view: StoreView, keyType: DataType, rowFields: Int)
    extends StoredRows {
    private val listKey = UnsafeProjection.create(Array(keyType))
    private val keyValue = new GenericInternalRow(1)
    override def withKey(key: UnsafeRow, visible: Long => Boolean): Iterator[InternalRow] =
      view.values(key).filter(value => visible(value.getLong(2)))
        .map(_.getStruct(0, rowFields))
    override def pointedTo(partitionKey: Any, sequence: Long, storedAtMs: Long): InternalRow = {
      keyValue.update(0, partitionKey)
      view.values(listKey(keyValue)).find(_.getLong(1) == sequence)
        .map(_.getStruct(0, rowFields)).orNull
    }
    override def all(): Iterator[StoredRow] = {
      val stored = new StoredRow
      view.listedIterator().map { pair =>
        stored.row = pair.value.getStruct(0, rowFields)
        stored.sequence = pair.value.getLong(1)
        stored.storedAtMs = pair.value.getLong(2)
        stored
      }
    }
  }
}

/**
 * The stores of one stream input in one task, for reading: the version the previous micro-batch
 * committed (`writer` is set in the task that writes this batch's version). A stored row is seen
 * only while `visible` holds for the time it was stored (spark.umjoin.stateTtl). `storedRows`:
 * the rows the input's store holds, where known (else 0).
 */
final class InputState private[streaming] (
    spec: InputStateSpec,
    rows: StoredRows,
    indexes: Map[StoreIndex, StoreView],
    visible: Long => Boolean,
    storedRows: () => Long) {

  private val partitionIndex = StoreIndex.single(spec.partitionClass)

  /**
   * The stored rows whose values of `index`'s classes are the fields of a key (the store is found
   * once, not per probe).
   */
  private def lookup(index: StoreIndex): UnsafeRow => Iterator[InternalRow] =
    if (index == partitionIndex) key => rows.withKey(key, visible)
    else {
      val store = indexes.getOrElse(index, throw new IllegalStateException(
        s"UMJoin state of input #${spec.input} has no index on classes ${index.classes}"))
      val sequence = index.classes.size
      key => store.prefixScan(key).filter(pair => visible(pair.value.getLong(1))).map { pair =>
        val row = rows.pointedTo(pair.value.get(0, spec.partitionKey.dataType),
          pair.key.getLong(sequence), pair.value.getLong(1))
        if (row == null) throw new IllegalStateException(s"UMJoin state of input #${spec.input}" +
          (": an index entry points to a row that is not stored; the checkpoint's state is " +
            "inconsistent"))
        row
      }
    }

  /** Every stored row still visible. */
  def visibleRows(): Iterator[InternalRow] =
    rows.all().filter(stored => visible(stored.storedAtMs)).map(_.row)

  /** A probe of this input's state through `index`, as the probe loop sees it. */
  def storeFor(index: StoreIndex): JoinStore = new JoinStore {
    private val rowsOf = lookup(index)
    override def get(key: UnsafeRow): Iterator[InternalRow] = rowsOf(key)
    override def isEmpty: Boolean = false // unknown without a scan; probing an empty store is cheap
    override def keyCount: Long = storedRows()
    override def sizeInBytes: Long = 0L
    override def close(): Unit = ()
  }
}

/**
 * How a stream input's stores are opened: the rows' store as the session configures state stores;
 * its indexes without RocksDB's count of keys
 * (spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows), which reads the key before every
 * write to count it. An index holds exactly one entry per stored row (a NULL key too: an outer
 * join's preserved row is stored whatever its ON key), so its entries are counted by the rows
 * instead. RocksDB stores commit with changelog checkpointing unless the session says otherwise: a
 * StreamingUMJoin commits one store per input and index in every partition and micro-batch, most
 * with few changes or none (a stored static table), and a changelog commit writes one small file
 * where a snapshot commit copies and uploads the store's files. A changelog commit does not flush
 * the store's memtable, so each store's grows to RocksDB's write buffer (64 MB, two of them)
 * between snapshots: UMJoin's stores take 16 MB unless the session sets the size (on the TPC-H Q9
 * block at SF 1, 670 MB less memory outside the heap, for about a tenth more time).
 */
final case class InputStateConf(rows: StateStoreConf, indexes: StateStoreConf)

object InputStateConf {
  val Changelog = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
  val WriteBufferSizeMB = "spark.sql.streaming.stateStore.rocksdb.writeBufferSizeMB"
  /** UMJoin's defaults for its stores, where the session does not set the key. */
  val Defaults: Map[String, String] = Map(Changelog -> "true", WriteBufferSizeMB -> "16")

  def apply(sqlConf: SQLConf): InputStateConf = {
    val rows = sqlConf.clone()
    Defaults.foreach { case (key, value) =>
      if (!sqlConf.contains(key)) rows.setConfString(key, value)
    }
    val untracked = rows.clone()
    untracked.setConfString("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows",
      "false")
    InputStateConf(new StateStoreConf(rows), new StateStoreConf(untracked))
  }
}

object InputState {
  def storeName(input: Int): String = s"umjoin-input-$input"
  def indexStoreName(storeName: String, position: Int): String = s"$storeName-index-$position"
  /**
   * The store of the preserved inputs' combinations that no row of outer input `outer` matched yet.
   */
  def unmatchedStoreName(outer: Int): String = s"umjoin-unmatched-$outer"

  /**
   * The name of a partition's one store where every input's stores are its column families
   * ([[StoreLayout.ColumnFamilies]]).
   */
  val PartitionStoreName = "umjoin"

  /** The committed state of the previous micro-batch, read-only. */
  def read(spec: InputStateSpec, stores: PartitionStores, confs: InputStateConf,
      visible: Long => Boolean): InputState = {
    val counted = stores.committedRows(spec.name, reading = true)
    val rowStore = spec.rowStore(stores.layout.rowsListedByKey)
    new InputState(spec, StoredRows(stores.read(rowStore, confs.rows), rowStore,
        spec.partitionKey.dataType, spec.output.size),
      spec.indexes.map(_._1).zip(spec.indexStores.map(stores.read(_, confs.indexes))).toMap,
      visible, () => counted.getOrElse(0L))
  }

  /** The state to write this micro-batch's version of; `stores` commits it. */
  def write(spec: InputStateSpec, stores: PartitionStores, confs: InputStateConf,
      visible: Long => Boolean): InputStateWriter = {
    val rowStore = spec.rowStore(stores.layout.rowsListedByKey)
    val primary = stores.write(rowStore, confs.rows)
    val indexes = spec.indexes.map(_._1).zip(spec.indexStores.map(stores.write(_, confs.indexes)))
      .toMap
    new InputStateWriter(spec, rowStore, primary, indexes, visible,
      stores.committedRows(spec.name, reading = false), stores)
  }

  /**
   * Every store is probed by prefix scans on all of its key's fields but the sequence number (and
   * the primary's time).
   */
  def keyEncoding(keySchema: StructType): PrefixKeyScanStateEncoderSpec =
    PrefixKeyScanStateEncoderSpec(keySchema,
      keySchema.fieldNames.takeWhile(_.startsWith("key")).length)
}

/**
 * Writes one micro-batch's changes to a stream input's stores in one partition; `stores` commits
 * them. `committedRows`: the rows the micro-batch before left, where the partition's one store
 * counts them (else the input's own store counts its keys).
 */
final class InputStateWriter(spec: InputStateSpec, rowStore: StoreSchema, primary: WritableView,
    indexes: Map[StoreIndex, WritableView], visible: Long => Boolean,
    committedRows: Option[Long], stores: PartitionStores) {
  private var change = 0L
  /** The rows the input's store holds now. */
  def rowCount: Long = committedRows.fold(primary.store.metrics.numKeys)(_ + change)
  stores.countRows(spec.name, () => rowCount)
  private val rows =
    StoredRows(primary.reading, rowStore, spec.partitionKey.dataType, spec.output.size)
  val state: InputState = new InputState(spec, rows,
    indexes.map { case (index, view) => index -> view.reading }, visible, () => rowCount)

  // A row's keys are read from the row joined with two numbers: its sequence number and when it was
  // stored. (Their code comes from the executor's pool: compiled per task, it turned Spark's code
  // cache over in a 10-way join.)
  private val numbers = new SpecificInternalRow(Seq(LongType, LongType))
  private val rowAndNumbers = new JoinedRow
  private val sequenceAttribute = AttributeReference("sequence", LongType, nullable = false)()
  private val storedAtAttribute = AttributeReference("storedAtMs", LongType, nullable = false)()
  private val numbered = spec.output :+ sequenceAttribute :+ storedAtAttribute
  private val rowKey =
    GeneratedCode.projection(Seq(spec.partitionKey, sequenceAttribute, storedAtAttribute), numbered)
  private val listKey = GeneratedCode.projection(Seq(spec.partitionKey), numbered)
  // A listed value (the row as a struct, its sequence number, when it was stored) is written from
  // the row's bytes: a projection of the struct read and wrote each field again (Q3: a third of
  // writing a row).
  private val listedValue = new UnsafeRowWriter(3, 128)
  private val indexValue =
    GeneratedCode.projection(Seq(spec.partitionKey, storedAtAttribute), numbered)
  private val indexKeyOf = spec.indexes.map { case (index, keys) =>
    index -> GeneratedCode.projection(keys :+ sequenceAttribute, numbered)
  }
  // Rows arrive as UnsafeRows of the input's layout, stored as they are; any other row is
  // converted.
  private val toStored = GeneratedCode.projection(spec.output, spec.output)
  // Unique within the partition: the batch in the high bits, the row's place in it in the low ones.
  private var sequence = primary.store.version << 32

  private def withNumbers(row: InternalRow, sequence: Long, storedAtMs: Long): InternalRow = {
    numbers.setLong(0, sequence)
    numbers.setLong(1, storedAtMs)
    rowAndNumbers(row, numbers)
  }

  /** Stores a row that arrived, as of `nowMs`. */
  def put(row: InternalRow, nowMs: Long): Unit = {
    val withBoth = withNumbers(row, sequence, nowMs)
    val stored = row match {
      case u: UnsafeRow if u.numFields == spec.output.size => u
      case other => toStored(other)
    }
    if (rowStore.listed) primary.merge(listKey(withBoth), listed(stored, sequence, nowMs))
    else primary.put(rowKey(withBoth), stored)
    if (indexKeyOf.nonEmpty) {
      val value = indexValue(withBoth)
      indexKeyOf.foreach { case (index, key) => indexes(index).put(key(withBoth), value) }
    }
    sequence += 1
    change += 1
  }

  private def listed(row: UnsafeRow, sequence: Long, storedAtMs: Long): UnsafeRow = {
    listedValue.reset()
    listedValue.zeroOutNullBytes()
    listedValue.write(0, row)
    listedValue.write(1, sequence)
    listedValue.write(2, storedAtMs)
    listedValue.getRow
  }

  /**
   * Removes every stored row `gone(storedAtMs, row)` selects, with its index entries; returns how
   * many.
   */
  def removeWhere(gone: (Long, UnsafeRow) => Boolean): Long = {
    val removed = if (rowStore.listed) removeListedWhere(gone) else removeEntriesWhere(gone)
    change -= removed
    removed
  }

  private def removeFromIndexes(row: InternalRow, sequence: Long): Unit =
    indexKeyOf.foreach { case (index, indexKeyOfRow) =>
      indexes(index).remove(indexKeyOfRow(withNumbers(row, sequence, 0L)))
    }

  private def removeEntriesWhere(gone: (Long, UnsafeRow) => Boolean): Long = {
    val doomed = mutable.ArrayBuffer[(UnsafeRow, UnsafeRow)]()
    primary.reading.iterator().foreach(pair =>
      if (gone(pair.key.getLong(2), pair.value)) doomed += ((pair.key.copy(), pair.value.copy())))
    doomed.foreach { case (key, row) =>
      primary.remove(key)
      removeFromIndexes(row, key.getLong(1))
    }
    doomed.size.toLong
  }

  // A key's list is written again without its removed rows as soon as the scan has passed it: the
  // scan reads the store as it was when it began (a RocksDB iterator's snapshot), so no more than
  // one key's rows are held.
  private def removeListedWhere(gone: (Long, UnsafeRow) => Boolean): Long = {
    var removed = 0L
    var key: UnsafeRow = null
    var keyLosesRows = false
    val kept = mutable.ArrayBuffer[UnsafeRow]()
    def rewrite(): Unit = if (keyLosesRows) {
      primary.remove(key)
      if (kept.nonEmpty) primary.putList(key, kept.toArray)
    }
    primary.reading.listedIterator().foreach { pair =>
      if (key == null || pair.key != key) {
        rewrite()
        key = pair.key.copy()
        keyLosesRows = false
        kept.clear()
      }
      val row = pair.value.getStruct(0, spec.output.size)
      if (gone(pair.value.getLong(2), row)) {
        removeFromIndexes(row, pair.value.getLong(1))
        keyLosesRows = true
        removed += 1
      } else kept += pair.value.copy()
    }
    rewrite()
    removed
  }

  def indexEntryCount: Long = rowCount * indexes.size
  /** The store instances holding the input's rows: its own, or the partition's one. */
  private def holding: Seq[StateStore] =
    (primary.store +: indexes.values.map(_.store).toSeq).distinct
  /** The memory of the input's own stores (0 where it shares the partition's one store). */
  def memoryBytes: Long =
    if (committedRows.isDefined) 0L else holding.map(_.metrics.memoryUsedBytes).sum
  /**
   * The bytes of the files on local disk of the stores holding the input's rows, where the provider
   * tells them (RocksDB's SST files; with one store per partition, every input's); else 0.
   */
  def diskBytes: Long = holding.map(_.metrics.customMetrics
    .collect { case (m, v) if m.name == "rocksdbSstFileSize" => v }.sum).sum
}

/**
 * The rows each stream input's store held in a partition when a task of this executor committed
 * it, by version: the next micro-batch's tasks, which the state store's locality mostly brings back
 * here, learn without a scan whether a store is small enough to read into memory (a store cannot be
 * asked before it is committed). A task elsewhere finds nothing and probes the store.
 */
object CommittedRowCounts {
  final case class Key(checkpoint: String, operator: Long, partition: Int, input: Int)
  // A count dropped (queries come and go) only costs a probe of the store.
  private val counts = new LeastRecentlyUsed[Key, (Long, Long)](maxEntries = 100000)

  def record(info: StatefulOperatorStateInfo, partition: Int, input: Int, version: Long,
      rows: Long): Unit =
    counts.update(Key(info.checkpointLocation, info.operatorId, partition, input),
      _ => (version, rows))

  /** The rows of the version this micro-batch reads, if this executor committed it. */
  def of(info: StatefulOperatorStateInfo, partition: Int, input: Int): Option[Long] =
    counts.get(Key(info.checkpointLocation, info.operatorId, partition, input)).collect {
      case (version, rows) if version == info.storeVersion => rows
    }
}
