package umjoin.spark.streaming

import org.apache.hadoop.conf.Configuration

import org.apache.spark.{SparkContext, TaskContext}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, BindReferences, UnsafeProjection,
  UnsafeRow}
import org.apache.spark.sql.catalyst.plans.physical.HashPartitioning
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.operators.stateful.join.{
  JoinStateManagerStoreGenerator, StreamingSymmetricHashJoinHelper,
  SymmetricHashJoinStateManager}
import org.apache.spark.sql.execution.streaming.state.StateStoreConf
import org.apache.spark.sql.types.StructType
import org.apache.spark.util.SerializableConfiguration

import umjoin.spark.core.{JoinGraph, ZippedInputsRDD}

/** A side of one of Spark's stream-stream joins. */
sealed trait SparkJoinSide {
  private[streaming] def spark: StreamingSymmetricHashJoinHelper.JoinSide
}

object SparkJoinSide {
  case object Left extends SparkJoinSide {
    override private[streaming] def spark = StreamingSymmetricHashJoinHelper.LeftSide
  }
  case object Right extends SparkJoinSide {
    override private[streaming] def spark = StreamingSymmetricHashJoinHelper.RightSide
  }
}

/**
 * Where one input's rows are in the state of Spark's stream-stream joins: one side of the join
 * with operator id `operatorId`, whose rows are the input's, keyed by values of `keySchema`.
 */
final case class SparkJoinInputState(operatorId: Long, side: SparkJoinSide,
    keySchema: StructType)

/**
 * The state of Spark's chained stream-stream joins a StreamingUMJoin takes over when a query that
 * ran them restarts with UMJoin on (issue 68): every input's rows, read from the side of the join
 * that holds them (`inputs`, in the group's input order), in Spark's join state format
 * `stateFormatVersion` (which the checkpoint keeps). `operators` are the joins' operator ids; the
 * StreamingUMJoin keeps the first's.
 */
final case class SparkJoinTakeOver(stateFormatVersion: Int,
    inputs: IndexedSeq[SparkJoinInputState], operators: Seq[Long]) {

  /** The joins' operators other than the StreamingUMJoin's. */
  def replaced(umjoinOperator: Long): Seq[Long] = operators.filter(_ != umjoinOperator)
}

object SparkJoinTakeOver {

  /**
   * Input `input`'s rows as Spark's join keeps them in `partition`, at the version the
   * StreamingUMJoin's micro-batch `info` reads (what the micro-batch before committed), each a
   * copy. The join's store is opened read-only by Spark's own state manager (as Spark's state
   * reader opens it), for whichever format wrote it, and released once its rows are read (or when
   * the task ends, whichever comes first).
   */
  def rows(takeOver: SparkJoinTakeOver, input: Int, output: Seq[Attribute],
      info: StatefulOperatorStateInfo, partition: Int, conf: StateStoreConf,
      hadoopConf: Configuration): Iterator[UnsafeRow] = {
    val state = takeOver.inputs(input)
    val manager = SymmetricHashJoinStateManager(state.side.spark, output,
      DataTypeUtils.toAttributes(state.keySchema), Some(info.copy(operatorId = state.operatorId)),
      conf, hadoopConf, partition, None, None, takeOver.stateFormatVersion, None, false, None,
      new JoinStateManagerStoreGenerator(), None, true)
    var open = true
    def release(): Unit = if (open) {
      open = false
      manager.abortIfNeeded()
    }
    Option(TaskContext.get()).foreach(_.addTaskCompletionListener[Unit](_ => release()))
    val pairs = manager.iterator
    new Iterator[UnsafeRow] {
      override def hasNext: Boolean = open && (pairs.hasNext || { release(); false })
      override def next(): UnsafeRow = pairs.next().value.copy()
    }
  }

  /**
   * Writes every input's rows from Spark's joins' state into the StreamingUMJoin's stores, laid
   * out by `layout`, as the version micro-batch `info` reads; the count of rows written. A job of
   * its own: each of Spark's partitions is read, its rows shipped as stages ship combinations
   * ([[ComboShuffle]]) to the partition the layout's partitioning places them in (a row of Spark's
   * join is in the partition of that join's key, the layout's may be another key), and each
   * partition's stores start empty at the version before (RocksDB's `loadEmpty`) and are
   * committed with the rows as `info.storeVersion`.
   */
  def writeInto(sc: SparkContext, takeOver: SparkJoinTakeOver, layout: StreamingLayout,
      graph: JoinGraph, outputs: IndexedSeq[Seq[Attribute]], info: StatefulOperatorStateInfo,
      storeConf: StateStoreConf, confs: InputStateConf, hadoopConf: Configuration): Long = {
    require(layout.stores.oneStorePerPartition && info.storeVersion >= 2,
      s"UMJoin: Spark's joins' state is taken over into RocksDB's stores, from version 2 on " +
        s"(stores ${layout.stores.name}, version ${info.storeVersion})")
    val partitions = info.numPartitions
    val conf = new SerializableConfiguration(hadoopConf)
    val places = outputs.indices.map { j =>
      val key = StreamingUMJoinExec.placement(layout, graph, j, partitions).toSeq
      BindReferences.bindReference(HashPartitioning(key, partitions).partitionIdExpression,
        outputs(j))
    }
    val specs = InputStateSpec.of(layout, graph, outputs)
    val stores = layout.stores
    val before = info.copy(storeVersion = info.storeVersion - 1)
    val nowMs = System.currentTimeMillis()
    val written = sc.longAccumulator("UMJoin: rows taken over from Spark's joins")
    val placed = outputs.indices.map { j =>
      ComboShuffle(sc.parallelize(0 until partitions, partitions).mapPartitions(_.flatMap { p =>
        val place = UnsafeProjection.create(Seq(places(j)))
        rows(takeOver, j, outputs(j), info, p, storeConf, conf.value)
          .map(row => (place(row).getInt(0), row: InternalRow))
      }), partitions, sc, outputs(j).size)
    }
    new ZippedInputsRDD[InternalRow, Unit](placed, { (context, read) =>
      val partition = context.partitionId()
      PartitionStores.startEmpty(before, partition, confs.indexes, conf.value)
      val partitionStores =
        new PartitionStores(stores, before, partition, confs, conf.value, context)
      specs.foreach { case (j, spec) =>
        val writer = InputState.write(spec, partitionStores, confs, _ => true)
        read(j).foreach { row =>
          writer.put(row, nowMs)
          written.add(1)
        }
      }
      partitionStores.commit()
      Iterator.empty
    }).foreach(_ => ())
    written.value
  }
}
