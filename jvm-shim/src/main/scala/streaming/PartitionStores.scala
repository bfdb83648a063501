package umjoin.spark.streaming

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec,
  NoPrefixKeyStateEncoderSpec, ReadStateStore, StateStore, StateStoreConf, StateStoreId,
  StateStoreProvider, StateStoreProviderId, UnsafeRowPair}
import org.apache.spark.sql.execution.umjoin.StoresClosedAtExit
import org.apache.spark.sql.types.{LongType, StringType, StructField, StructType}
import org.apache.spark.unsafe.types.UTF8String

/**
 * One of an input's stores as a task reads it: a state store of its own (its default column
 * family), or a column family of the partition's one store ([[StoreLayout]]).
 */
final case class StoreView(store: ReadStateStore, family: String) {
  def get(key: UnsafeRow): UnsafeRow = store.get(key, family)
  def prefixScan(key: UnsafeRow): Iterator[UnsafeRowPair] = store.prefixScan(key, family)
  def iterator(): Iterator[UnsafeRowPair] = store.iterator(family)
  /** A listed family's values under `key`. */
  def values(key: UnsafeRow): Iterator[UnsafeRow] = store.valuesIterator(key, family)
  /** A listed family's entries, one pair per value, a key's values one after another. */
  def listedIterator(): Iterator[UnsafeRowPair] = store.iteratorWithMultiValues(family)
}

/** One of an input's stores as the task that writes the micro-batch's version sees it. */
final case class WritableView(store: StateStore, family: String) {
  def reading: StoreView = StoreView(store, family)
  def put(key: UnsafeRow, value: UnsafeRow): Unit = store.put(key, value, family)
  def remove(key: UnsafeRow): Unit = store.remove(key, family)
  /** Appends `value` to a listed family's values under `key`. */
  def merge(key: UnsafeRow, value: UnsafeRow): Unit = store.merge(key, value, family)
  /** Replaces a listed family's values under `key`. */
  def putList(key: UnsafeRow, values: Array[UnsafeRow]): Unit = store.putList(key, values, family)
}

/**
 * The state stores one task of a StreamingUMJoin opens in its partition, kept as `layout` says:
 * each store on its own, or every one as a column family of the partition's one RocksDB store,
 * opened once for the task (read-only before the last stage, written in it). A store read is
 * released when the task ends; one written is aborted then unless [[commit]] committed it.
 */
private[streaming] final class PartitionStores(val layout: StoreLayout,
    info: StatefulOperatorStateInfo, partition: Int, confs: InputStateConf,
    hadoopConf: Configuration, context: TaskContext) {
  import PartitionStores._

  private val written = mutable.ArrayBuffer[StateStore]()
  // Per input's rows' store in the one store, its count of rows as this task will commit it.
  private val counted = mutable.LinkedHashMap[String, () => Long]()

  private def providerId(name: String): StateStoreProviderId =
    StateStoreProviderId(StateStoreId(info.checkpointLocation, info.operatorId, partition, name),
      info.queryRunId)

  private def encoding(schema: StoreSchema, families: Boolean): KeyStateEncoderSpec =
    if (families) NoPrefixKeyStateEncoderSpec(schema.keySchema) else schema.keyEncoding

  private def openRead(schema: StoreSchema, families: Boolean,
      conf: StateStoreConf): ReadStateStore = {
    StoresClosedAtExit.ensure()
    val store = StateStore.getReadOnly(providerId(schema.name), schema.keySchema,
      schema.valueSchema, encoding(schema, families), info.storeVersion, None, None, families,
      conf, hadoopConf)
    context.addTaskCompletionListener[Unit](_ => store.release())
    store
  }

  private def openWrite(schema: StoreSchema, families: Boolean,
      conf: StateStoreConf): StateStore = {
    StoresClosedAtExit.ensure()
    val store = StateStore.get(providerId(schema.name), schema.keySchema, schema.valueSchema,
      encoding(schema, families), info.storeVersion, None, None, families, conf, hadoopConf)
    context.addTaskCompletionListener[Unit](_ => if (!store.hasCommitted) store.abort())
    written += store
    store
  }

  // The partition's one store (ColumnFamilies), its default family holding the inputs' row counts.
  // Its rows are counted here, not by RocksDB (which would read every key before writing it).
  private lazy val sharedRead: ReadStateStore =
    openRead(PartitionStoreSchema, families = true, confs.indexes)
  private lazy val sharedWrite: StateStore =
    openWrite(PartitionStoreSchema, families = true, confs.indexes)

  private def family(store: ReadStateStore, schema: StoreSchema): Unit = store match {
    case s: StateStore => s.createColFamilyIfAbsent(schema.name, schema.keySchema,
      schema.valueSchema, schema.keyEncoding, useMultipleValuesPerKey = schema.listed)
    case other => throw new IllegalStateException(
      s"UMJoin: a read-only store of ${other.getClass.getName} has no column families")
  }

  /**
   * Where store `schema` is in the layout: a store of its own (`own`) and its default family, or
   * the partition's one store (`shared`, given the family's schema: a read store takes them again
   * every time it is opened) and the family of that name.
   */
  private def placed[S <: ReadStateStore](schema: StoreSchema, own: => S,
      shared: => S): (S, String) =
    if (layout.oneStorePerPartition) {
      family(shared, schema)
      (shared, schema.name)
    } else (own, StateStore.DEFAULT_COL_FAMILY_NAME)

  /** Store `schema` as committed by the micro-batch before, read-only. */
  def read(schema: StoreSchema, conf: StateStoreConf): StoreView =
    StoreView.tupled(placed(schema, openRead(schema, families = false, conf), sharedRead))

  /** Store `schema`, to write this micro-batch's version of. */
  def write(schema: StoreSchema, conf: StateStoreConf): WritableView =
    WritableView.tupled(placed(schema, openWrite(schema, families = false, conf), sharedWrite))

  /**
   * The rows the store of rows `name` held when the micro-batch before committed it: counted by
   * the partition's one store (ColumnFamilies) or by the store itself (None).
   */
  def committedRows(name: String, reading: Boolean): Option[Long] =
    if (layout.oneStorePerPartition) {
      val store = if (reading) sharedRead else sharedWrite
      Some(Option(store.get(countKey(name))).fold(0L)(_.getLong(0)))
    } else None

  /** Counts the rows of store `name` as `rows` gives them when the task commits. */
  def countRows(name: String, rows: () => Long): Unit = counted(name) = rows

  /**
   * Commits every store written (ColumnFamilies: the one store, once, with its inputs' counts of
   * rows).
   */
  def commit(): Unit = {
    if (layout.oneStorePerPartition && written.nonEmpty) {
      val count = UnsafeProjection.create(CountValue)
      counted.foreach { case (name, rows) =>
        sharedWrite.put(countKey(name), count(InternalRow(rows())).copy())
      }
    }
    written.foreach(_.commit())
  }

  /** The store instances this task wrote: one per store, or the partition's one. */
  def instances: Seq[StateStore] = written.toSeq
}

object PartitionStores {
  /**
   * Writes an empty version `info.storeVersion` of the one store of `partition`, where a
   * StreamingUMJoin starts its stores in a checkpoint's later micro-batch: one of stored static
   * tables only (loaded again then), or one taking Spark's joins' state over (written into the
   * version after, [[SparkJoinTakeOver]]). Spark's RocksDB provider opens a store empty at any
   * version (`loadEmpty`, as Spark's offline repartitioning writes state); committed as a
   * snapshot, so that the version loads without the changelogs of the versions before.
   */
  def startEmpty(info: StatefulOperatorStateInfo, partition: Int, conf: StateStoreConf,
      hadoopConf: Configuration): Unit = {
    val schema = PartitionStoreSchema
    val id = StateStoreProviderId(StateStoreId(info.checkpointLocation, info.operatorId,
      partition, schema.name), info.queryRunId)
    val provider = StateStoreProvider.createAndInit(id, schema.keySchema, schema.valueSchema,
      NoPrefixKeyStateEncoderSpec(schema.keySchema), true, conf, hadoopConf, false, None)
    try provider.getStore(info.storeVersion - 1, None, true, true).commit()
    finally provider.close()
  }

  /** The default family of a partition's one store: a rows' store's name, and its rows. */
  val CountKey: StructType = StructType(Seq(StructField("key", StringType, nullable = false)))
  val CountValue: StructType = StructType(Seq(StructField("rows", LongType, nullable = false)))
  /** The partition's one store, as opened: its default family holds the counts. */
  val PartitionStoreSchema: StoreSchema =
    StoreSchema(InputState.PartitionStoreName, CountKey, CountValue)

  /** The key of store `name`'s count of rows (written directly: no code is generated per call). */
  private[streaming] def countKey(name: String): UnsafeRow = {
    val writer = new UnsafeRowWriter(1)
    writer.resetRowWriter()
    writer.write(0, UTF8String.fromString(name))
    writer.getRow.copy()
  }
}
