package umjoin.spark.testkit

import java.util.UUID

import org.json4s.JsonAST._
import org.json4s.jackson.JsonMethods.{compact, render}

import org.apache.hadoop.conf.Configuration

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.{QueryExecution, SparkPlan}
import org.apache.spark.sql.execution.streaming.operators.stateful.join.{
  StreamingSymmetricHashJoinExec, SymmetricHashJoinStateManager}
import org.apache.spark.sql.execution.streaming.operators.stateful.join
  .StreamingSymmetricHashJoinHelper.{LeftSide, RightSide}
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec,
  NoPrefixKeyStateEncoderSpec, ReadStateStore, StateStore, StateStoreConf, StateStoreId,
  StateStoreProvider, StateStoreProviderId, UnsafeRowPair}
import org.apache.spark.sql.types.StructType
import org.apache.spark.util.SerializableConfiguration

import umjoin.spark.streaming.{InputState, InputStateConf, InputStateSpec, PartitionStores,
  StoreSchema, StreamingUMJoinExec}

/**
 * One state store of a streaming query's operator in one partition, as its operator opens it;
 * `families`, where it keeps column families, their schemas (its default family is read too).
 */
final case class StateStoreOnDisk(checkpoint: String, operatorId: Long,
    partition: Int, name: String, keySchema: StructType,
    valueSchema: StructType, keyEncoding: KeyStateEncoderSpec, conf: StateStoreConf,
    families: Seq[StoreSchema] = Nil) {

  /** A provider of this store, to be closed after use. */
  def provider(hadoopConf: Configuration): StateStoreProvider =
    StateStoreProvider.createAndInit(StateStoreProviderId(StateStoreId(checkpoint, operatorId,
      partition, name), UUID.randomUUID()), keySchema, valueSchema, keyEncoding,
      families.nonEmpty, conf, hadoopConf, false, None)

  /**
   * What a read store of it holds, per family: (the store's or family's name, the bytes of each
   * row it holds). An entry is a row; in a listed family each value is, a key's bytes counted with
   * its first value.
   */
  def contents(read: ReadStateStore): Seq[(String, Iterator[Long])] =
    (name -> read.iterator().map(bytes)) +: families.map { family =>
      read.asInstanceOf[StateStore].createColFamilyIfAbsent(family.name, family.keySchema,
        family.valueSchema, family.keyEncoding, useMultipleValuesPerKey = family.listed)
      family.name -> (if (family.listed) {
        var previous: UnsafeRow = null
        read.iteratorWithMultiValues(family.name).map { pair =>
          val first = previous == null || pair.key != previous
          if (first) previous = pair.key.copy()
          (if (first) pair.key.getSizeInBytes else 0L) + pair.value.getSizeInBytes
        }
      } else read.iterator(family.name).map(bytes))
    }

  private def bytes(pair: UnsafeRowPair): Long = pair.key.getSizeInBytes + pair.value.getSizeInBytes
}

/**
 * The exact size of a streaming query's state after each micro-batch, read back from its
 * checkpoint: per store, its rows and the bytes of their keys and values as stored (UnsafeRows),
 * the same measure for Spark's stream-stream joins and for StreamingUMJoins, comparable with a
 * Flink savepoint's size. Memory metrics of the state stores say what RocksDB holds (memtables,
 * block cache), which is mostly not the rows.
 */
object StateSizes {

  /**
   * Every store of the plan's stream-stream joins (format 1 or 2 of Spark's join state) and
   * StreamingUMJoins.
   */
  def stores(session: SparkSession, plan: SparkPlan): Seq[StateStoreOnDisk] = {
    val sparkConf = new StateStoreConf(session.sessionState.conf)
    val umjoinConfs = InputStateConf(session.sessionState.conf)
    plan.collect {
      case join: StreamingSymmetricHashJoinExec =>
        require(Set(1, 2).contains(join.stateFormatVersion),
          s"Spark's join state format ${join.stateFormatVersion}" +
            " keeps its stores otherwise; measured here: formats 1 and 2")
        val info = join.getStateInfo
        val schemas = Seq(LeftSide -> (join.left.output, join.leftKeys),
          RightSide -> (join.right.output, join.rightKeys)).flatMap {
            case (side, (attributes, keys)) =>
              SymmetricHashJoinStateManager.getSchemaForStateStores(side, attributes, keys,
                join.stateFormatVersion).toSeq
          }
        for (partition <- 0 until info.numPartitions; (name, (keySchema, valueSchema)) <- schemas)
          yield StateStoreOnDisk(info.checkpointLocation, info.operatorId, partition, name,
            keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema), sparkConf)
      case umjoin: StreamingUMJoinExec =>
        val info = umjoin.getStateInfo
        val (inputs, waiting) = umjoin.stateSpecs.partition(spec =>
          umjoin.layout.stored.exists(InputState.storeName(_) == spec.name))
        def own(specs: Seq[InputStateSpec]): Seq[(StoreSchema, StateStoreConf)] =
          specs.flatMap(spec => (spec.rowStore(listed = false) -> umjoinConfs.rows) +:
            spec.indexStores.map(_ -> umjoinConfs.indexes))
        def separate(partition: Int, schemas: Seq[(StoreSchema, StateStoreConf)]) =
          schemas.map { case (store, conf) =>
            StateStoreOnDisk(info.checkpointLocation, info.operatorId, partition, store.name,
              store.keySchema, store.valueSchema, store.keyEncoding, conf)
          }
        val layout = umjoin.layout.stores
        (0 until info.numPartitions).flatMap(partition =>
          if (layout.oneStorePerPartition) {
            val shared = if (inputs.isEmpty) Nil else Seq(StateStoreOnDisk(info.checkpointLocation,
              info.operatorId, partition, InputState.PartitionStoreName,
              PartitionStores.CountKey, PartitionStores.CountValue,
              NoPrefixKeyStateEncoderSpec(PartitionStores.CountKey), umjoinConfs.indexes,
              inputs.flatMap(spec => spec.rowStore(layout.rowsListedByKey) +: spec.indexStores)))
            shared ++ separate(partition, own(waiting))
          } else separate(partition, own(inputs ++ waiting)))
    }.flatten
  }

  /**
   * The rows each store of a streaming query's `execution` (its last) held in each partition after
   * micro-batch `batchId`: `[{"store": name, "partition": p, "rows": r}, ...]`.
   */
  def perPartitionJson(execution: QueryExecution, batchId: Long): String = {
    val session = execution.sparkSession
    val hadoopConf = new SerializableConfiguration(session.sessionState.newHadoopConf())
    val all = stores(session, execution.executedPlan)
    val rows = session.sparkContext.parallelize(all, math.max(1, all.size)).flatMap { store =>
      val provider = store.provider(hadoopConf.value)
      try {
        val read = provider.getReadStore(batchId + 1, None)
        try store.contents(read).map { case (name, entries) =>
          (name, store.partition, entries.size)
        } finally read.release()
      } finally provider.close()
    }.collect()
    compact(render(JArray(rows.toList.map { case (name, partition, count) =>
      JObject("store" -> JString(name), "partition" -> JInt(partition), "rows" -> JLong(count))
    })))
  }

  /**
   * Per micro-batch of `batchIds`, the rows and bytes of every store of a streaming query's
   * `execution` (its last) as the batch committed them, summed: `[{"batch": b, "rows": r, "bytes":
   * n}, ...]`. Each store is opened from the checkpoint by a provider of its own and closed after
   * it is read.
   */
  def perBatchJson(execution: QueryExecution, batchIds: Array[Long]): String = {
    // The query's own session: its settings (the state store provider) as the query started.
    val session = execution.sparkSession
    val hadoopConf = new SerializableConfiguration(session.sessionState.newHadoopConf())
    val all = stores(session, execution.executedPlan)
    val versions = batchIds.toSeq.sorted
    val sizes = session.sparkContext.parallelize(all, math.max(1, all.size)).flatMap { store =>
      val provider = store.provider(hadoopConf.value)
      // In ascending order, so that a provider replaying changes goes on from the version it read
      // before.
      try versions.map { batch =>
        // Batch b commits version b + 1 of each store.
        val read = provider.getReadStore(batch + 1, None)
        try {
          var rows = 0L
          var bytes = 0L
          store.contents(read).foreach(_._2.foreach { rowBytes =>
            rows += 1
            bytes += rowBytes
          })
          (batch, (rows, bytes))
        } finally read.release()
      } finally provider.close()
    }.collect().groupBy(_._1).toSeq.sortBy(_._1)
    compact(render(JArray(sizes.toList.map { case (batch, perStore) =>
      JObject("batch" -> JLong(batch), "rows" -> JLong(perStore.map(_._2._1).sum),
        "bytes" -> JLong(perStore.map(_._2._2).sum))
    })))
  }
}
