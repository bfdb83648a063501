package umjoin.spark.exec

import java.io.{ObjectInputStream, ObjectOutputStream}

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, BasePredicate, Expression, GenericInternalRow, Predicate, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.plans.physical.{Distribution, Partitioning, StatefulOpClusteredDistribution, UnknownPartitioning}
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperatorCustomMetric, StatefulOperatorCustomSumMetric, StatefulOperatorStateInfo, StateStoreWriter}
import org.apache.spark.sql.execution.streaming.state.{PrefixKeyScanStateEncoderSpec, StateSchemaValidationResult, StateStore, StateStoreConf, StateStoreId, StateStoreProviderId, UnsafeRowPair}
import org.apache.spark.sql.types.{LongType, StructField, StructType}

import umjoin.spark.order.{ProbeCounters, ProbeCountersAccumulator, ProbeOrderSettings, StoreStructure, StreamingRoutes}
import umjoin.spark.planning.{JoinGraph, ProbeSteps, StoreIndex}
import umjoin.spark.state.JoinStore

/**
 * The streaming UMJoin: one multi-way inner join over the streams of a TSC group, keeping one
 * state store per input (Spark's state store API with the session's provider; RocksDB's is an
 * LSM-tree) and no intermediate results. All inputs are hash-partitioned on one join key class,
 * `keys(i)` being input i's expression for it, and each store keeps its input's rows by that key.
 *
 * A micro-batch applies its new rows input by input (paper 000, 3.1.3): new rows of input i probe
 * the stores of inputs before i with this batch's rows already in them, and of inputs after i with
 * the earlier batches' rows only, then join their own store. So every combination of rows is produced
 * exactly once, by whichever of its rows arrived last (in batch, then input order). Then expired rows
 * are evicted and every store is committed.
 *
 * The join itself is its key classes (`classInputs`, `classKeys`) and residual conditions, as in
 * [[UMJoinExec]]; `sharedClass` is the class every input takes part in, the stores' key. Any order of
 * the inputs is a valid probe route, each step probing by that key. With an adaptive `probeOrder`,
 * the tasks count every probe's outcome and the driver chooses the routes again between
 * micro-batches ([[StreamingRoutes]]), so the statistics carry over from one batch to the next.
 *
 * @param lateRows    per input, its rows that arrived too late (dropped, as Spark's join drops them)
 * @param evictable   per input, its stored rows no future row can join any more
 * @param stateTtlMs  optional bound on how long any stored row is kept (spark.umjoin.stateTtl): rows
 *                    stored longer ago are removed before a batch's rows probe
 */
case class StreamingUMJoinExec(
    output: Seq[Attribute],
    inputLabels: Seq[String],
    keys: Seq[Expression],
    classInputs: Seq[Seq[Int]],
    classKeys: Seq[Seq[Expression]],
    residuals: Seq[Expression],
    residualInputs: Seq[Seq[Int]],
    sharedClass: Int,
    probeOrder: ProbeOrderSettings,
    lateRows: Seq[Option[Expression]],
    evictable: Seq[Option[Expression]],
    stateTtlMs: Option[Long],
    stateInfo: Option[StatefulOperatorStateInfo],
    eventTimeWatermarkForEviction: Option[Long],
    children: Seq[SparkPlan]) extends SparkPlan with StateStoreWriter {

  override def nodeName: String = "StreamingUMJoin"
  override def shortName: String = "umJoin"
  override val stateStoreNames: Seq[String] = children.indices.map(StreamingUMJoinExec.storeName)

  private def joinGraph: JoinGraph = JoinGraph.fromFields(children.size, classInputs, classKeys, residuals, residualInputs)

  override def requiredChildDistribution: Seq[Distribution] =
    keys.map(k => StatefulOpClusteredDistribution(Seq(k), getStateInfo.numPartitions))

  override def outputPartitioning: Partitioning = UnknownPartitioning(getStateInfo.numPartitions)

  // Schemas of UMJoin's own stores are checked when they are opened; Spark's schema rule runs on the
  // joins this node replaces, before it exists.
  override def validateAndMaybeEvolveStateSchema(hadoopConf: Configuration, batchId: Long, stateSchemaVersion: Int): List[StateSchemaValidationResult] = Nil

  /** Per input: its state (rows, bytes) and its probes; they show in the query's progress too. */
  override def customStatefulOperatorMetrics: Seq[StatefulOperatorCustomMetric] =
    StatefulOperatorCustomSumMetric("probeRouteChanges", "probe routes changed before this batch") +: children.indices.flatMap { i =>
    val name = s"input #$i ${inputLabels(i)}"
    Seq(
      StatefulOperatorCustomSumMetric(s"stateRowsInput$i", s"$name: state rows"),
      StatefulOperatorCustomSumMetric(s"stateBytesInput$i", s"$name: state memory bytes"),
      StatefulOperatorCustomSumMetric(s"rowsInInput$i", s"$name: rows in"),
      StatefulOperatorCustomSumMetric(s"probesInput$i", s"$name: probes"),
      StatefulOperatorCustomSumMetric(s"matchesInput$i", s"$name: matches"),
      StatefulOperatorCustomSumMetric(s"earlyStopsInput$i", s"$name: early stops"))
  }

  private def inputMetrics(i: Int): InputMetrics = InputMetrics(
    longMetric(s"rowsInInput$i"), longMetric(s"probesInput$i"), longMetric(s"matchesInput$i"),
    longMetric(s"earlyStopsInput$i"), longMetric(s"stateBytesInput$i"))

  /** A batch with no new rows still runs when the watermark moved past what the state holds. */
  override def shouldRunAnotherBatch(newInputWatermark: Long): Boolean =
    evictable.exists(_.isDefined) && eventTimeWatermarkForEviction.exists(newInputWatermark > _)

  override protected def doExecute(): RDD[InternalRow] = {
    val info = getStateInfo
    val storeConf = new StateStoreConf(conf)
    val hadoopConf = new SerializableHadoopConf(session.sessionState.newHadoopConf())
    val n = children.size
    val outputs = children.map(_.output)
    val allMetrics = children.indices.map(inputMetrics)
    val (keyExprs, graph, shared, late, expire, ttl, resultAttrs) = (keys, joinGraph, sharedClass, lateRows, evictable, stateTtlMs, output)
    // The routes of this batch, chosen from the statistics of the batches before it.
    val (routes, changed) = StreamingRoutes.next(info.queryRunId, info.operatorId, ProbeSteps.graph(graph), probeOrder, StoreStructure.Sorted, info.numPartitions)
    longMetric("probeRouteChanges") += changed
    val statistics = Option.when(probeOrder.adaptive) {
      val accumulator = new ProbeCountersAccumulator(n)
      sparkContext.register(accumulator, s"UMJoin probe statistics, operator ${info.operatorId}")
      StreamingRoutes.collect(info.queryRunId, info.operatorId, accumulator)
      accumulator
    }
    val numOutputRows = longMetric("numOutputRows")
    val numDropped = longMetric("numRowsDroppedByWatermark")
    val numUpdated = longMetric("numUpdatedStateRows")
    val numRemoved = longMetric("numRemovedStateRows")
    val stateRows = children.indices.map(i => longMetric(s"stateRowsInput$i"))
    val now = System.currentTimeMillis() // this batch's time, the same for every task and retry
    val self = this

    new ZippedInputsRDD[InternalRow, InternalRow](children.map(_.execute()), { (context, iterators) =>
      val stores = (0 until n).map { i =>
        val keySchema = StreamingUMJoinExec.keySchema(keyExprs(i))
        StateStore.get(
          StateStoreProviderId(StateStoreId(info.checkpointLocation, info.operatorId, context.partitionId(), StreamingUMJoinExec.storeName(i)), info.queryRunId),
          keySchema, DataTypeUtils.fromAttributes(outputs(i)), PrefixKeyScanStateEncoderSpec(keySchema, 1), info.storeVersion,
          None, None, false, storeConf, hadoopConf.value, false)
      }
      context.addTaskCompletionListener[Unit](_ => stores.foreach(s => if (!s.hasCommitted) s.abort()))
      val joinStores = stores.map(new StateJoinStore(_))
      val keyOf = (0 until n).map(i => UnsafeProjection.create(Seq(keyExprs(i)), outputs(i)))
      val entryKey = new GenericInternalRow(3)
      val toKeyRow = UnsafeProjection.create(StreamingUMJoinExec.keySchema(keyExprs.head).map(_.dataType).toArray)
      var sequence = info.storeVersion << 32
      val counters = statistics.map(_ => new ProbeCounters(n))

      def predicate(expr: Option[Expression], attrs: Seq[Attribute]): Option[BasePredicate] = expr.map { e =>
        val p = Predicate.create(e, attrs)
        p.initialize(context.partitionId())
        p
      }

      /** Removes the stored rows of input i that `gone` selects (collected first: a store is not changed while scanned). */
      def removeWhere(i: Int, gone: UnsafeRowPair => Boolean): Unit = {
        val keys = mutable.ArrayBuffer[UnsafeRow]()
        stores(i).iterator().foreach(pair => if (gone(pair)) keys += pair.key.copy())
        keys.foreach(stores(i).remove(_))
        numRemoved += keys.size
      }

      // A row older than the TTL never joins again: expire before this batch's rows probe.
      ttl.foreach(ttlMs => (0 until n).foreach(i => removeWhere(i, _.key.getLong(2) <= now - ttlMs)))

      // Input by input: rows of input s probe the other stores, then go into their own.
      val joined = (0 until n).iterator.flatMap { s =>
        val isLate = predicate(late(s), outputs(s))
        val toStore = UnsafeProjection.create(outputs(s), outputs(s))
        val fresh = iterators(s).filter { row =>
          val dropped = isLate.exists(_.eval(row))
          if (dropped) numDropped += 1
          !dropped
        }.map { row =>
          val key = keyOf(s)(row)
          if (!key.anyNull) {
            entryKey.update(0, key.get(0, keyExprs(s).dataType))
            entryKey.update(1, sequence)
            entryKey.update(2, now)
            sequence += 1
            stores(s).put(toKeyRow(entryKey), toStore(row))
            numUpdated += 1
          }
          row
        }
        val route = CompiledRoute(ProbeSteps.along(graph, routes(s), _ => Seq(StoreIndex.single(shared))), outputs, resultAttrs,
          (input, _) => joinStores(input), identity, allMetrics, context.partitionId())
        val core = new ProbeCore(route, allMetrics(s), numOutputRows, context, counters)
        // Rows the probe did not pull (nothing to probe) must still be stored.
        core.join(fresh) ++ new Iterator[InternalRow] {
          override def hasNext: Boolean = { fresh.foreach(_ => ()); false }
          override def next(): InternalRow = throw new NoSuchElementException
        }
      }

      new Iterator[InternalRow] {
        private var finished = false
        override def hasNext: Boolean = joined.hasNext || { if (!finished) finish(); false }
        override def next(): InternalRow = joined.next()

        /** Evicts what the watermark says can no longer join, commits every store, and reports the state. */
        private def finish(): Unit = {
          finished = true
          (0 until n).foreach { i =>
            predicate(expire(i), outputs(i)).foreach(expired => removeWhere(i, pair => expired.eval(pair.value)))
            stores(i).commit()
            self.setStoreMetrics(stores(i), false)
            allMetrics(i).storeSize += stores(i).metrics.memoryUsedBytes
            stateRows(i) += stores(i).metrics.numKeys
            counters.foreach(_.stored(i) = stores(i).metrics.numKeys)
          }
          statistics.foreach(accumulator => counters.foreach(accumulator.add))
          self.setOperatorMetrics(n)
        }
      }
    })
  }

  override def simpleString(maxFields: Int): String = {
    val inputs = children.indices.map(i => s"#$i ${inputLabels(i)} (key ${keys(i)})").mkString(", ")
    val conditions = joinGraph.residuals.map(_.condition) ++ joinGraph.classes.indices.filter(_ != sharedClass).map { c =>
      joinGraph.classes(c).members.map(_._2).mkString(" = ")
    }
    val conditionText = if (conditions.isEmpty) "" else s", conditions=[${conditions.take(maxFields).mkString(", ")}]"
    s"$nodeName inputs=[$inputs]$conditionText, probeOrder=${probeOrder.policy.name}, operator=${stateInfo.map(_.operatorId).getOrElse("?")}"
  }

  override protected def withNewChildrenInternal(newChildren: IndexedSeq[SparkPlan]): StreamingUMJoinExec =
    copy(children = newChildren)
}

object StreamingUMJoinExec {
  def storeName(input: Int): String = s"umjoin-input-$input"

  /** A store's key: the join key (the prefix scanned by probes), a sequence number, the time it was stored. */
  def keySchema(key: Expression): StructType = StructType(Seq(
    StructField("key", key.dataType), StructField("sequence", LongType, nullable = false), StructField("storedAtMs", LongType, nullable = false)))
}

/** An input's state store as a UMJoin store: a probe is a prefix scan on the join key. */
private final class StateJoinStore(store: StateStore) extends JoinStore {
  override def get(key: UnsafeRow): Iterator[InternalRow] = store.prefixScan(key).map(_.value)
  override def isEmpty: Boolean = false // unknown without a scan; probing an empty store is cheap
  override def keyCount: Long = store.metrics.numKeys
  override def sizeInBytes: Long = store.metrics.memoryUsedBytes
  override def close(): Unit = ()
}

/** A Hadoop configuration that travels to the tasks (Configuration itself is not serializable). */
private final class SerializableHadoopConf(@transient var value: Configuration) extends Serializable {
  private def writeObject(out: ObjectOutputStream): Unit = {
    out.defaultWriteObject()
    value.write(out)
  }
  private def readObject(in: ObjectInputStream): Unit = {
    value = new Configuration(false)
    value.readFields(in)
  }
}
