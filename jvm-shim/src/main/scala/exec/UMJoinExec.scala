package umjoin.spark.exec

import org.json4s.JsonAST._

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{And, Attribute, AttributeSet, BasePredicate, BindReferences, Expression, Predicate, UnsafeProjection}
import org.apache.spark.sql.catalyst.plans.physical.{BroadcastDistribution, ClusteredDistribution, Distribution, Partitioning, PartitioningCollection, UnknownPartitioning, UnspecifiedDistribution}
import org.apache.spark.sql.execution.SparkPlan
import org.apache.spark.sql.execution.joins.HashedRelationBroadcastMode
import org.apache.spark.sql.execution.metric.{SQLMetric, SQLMetrics}
import org.apache.spark.sql.execution.umjoin.InMemoryStore

import umjoin.spark.UMJoinConf
import umjoin.spark.state.{JoinStores, StoreMetrics}

/**
 * The batch UMJoin: one multi-way inner join over `children` (the inputs of a TSC group).
 * Every input but the streamed one (head of `probeOrder`) is kept in a store indexed by
 * `storeKeys`; broadcast inputs' stores are built once by Spark's broadcast exchange, partitioned
 * ones per task from the input's partition, with `spark.umjoin.stateBackend` (memory, RocksDB, or
 * memory moving to RocksDB). Each streamed row then probes the stores in probe order (see
 * [[ProbeCore]]). The streamed input, usually the largest, is never stored.
 *
 * @param inputLabels   what each input reads (table names), for plans people read
 * @param probeKeys     per input, the key computed from the inputs before it in probe order
 * @param conditions    per input, the conditions checked as soon as its row is bound
 * @param broadcast     per input, whether every task gets all of it
 * @param partitionKeys per input, the key it is hash-partitioned on (one key class for all)
 */
case class UMJoinExec(
    output: Seq[Attribute],
    inputLabels: Seq[String],
    probeOrder: Seq[Int],
    storeKeys: Seq[Seq[Expression]],
    probeKeys: Seq[Seq[Expression]],
    conditions: Seq[Seq[Expression]],
    broadcast: Seq[Boolean],
    partitionKeys: Seq[Option[Expression]],
    children: Seq[SparkPlan]) extends SparkPlan {

  override def nodeName: String = "UMJoin"

  private def streamed: Int = probeOrder.head

  override def requiredChildDistribution: Seq[Distribution] = children.indices.map { i =>
    if (broadcast(i)) UMJoinExec.broadcastDistribution(storeKeys(i), children(i).output)
    else partitionKeys(i).map(k => ClusteredDistribution(Seq(k))).getOrElse(UnspecifiedDistribution)
  }

  /** Output rows keep the partitioning of the inputs that are not broadcast, where it is still visible. */
  override def outputPartitioning: Partitioning = {
    val outputSet = AttributeSet(output)
    val local = children.indices.filterNot(broadcast).map(children(_).outputPartitioning)
    val visible = local.filter {
      case e: Expression => e.references.subsetOf(outputSet)
      case _ => true
    }
    visible match {
      case Seq(one) => one
      case many if many.nonEmpty && many.map(_.numPartitions).distinct.size == 1 => PartitioningCollection(many)
      case _ => UnknownPartitioning(local.head.numPartitions)
    }
  }

  override lazy val metrics: Map[String, SQLMetric] =
    Map("numOutputRows" -> SQLMetrics.createMetric(sparkContext, "number of output rows")) ++
      children.indices.flatMap { i =>
        val name = s"input #$i ${inputLabels(i)}"
        Seq(
          s"in${i}RowsIn" -> SQLMetrics.createMetric(sparkContext, s"$name: rows in"),
          s"in${i}Probes" -> SQLMetrics.createMetric(sparkContext, s"$name: probes"),
          s"in${i}Matches" -> SQLMetrics.createMetric(sparkContext, s"$name: matches"),
          s"in${i}EarlyStops" -> SQLMetrics.createMetric(sparkContext, s"$name: early stops"),
          s"in${i}StoreSize" -> SQLMetrics.createSizeMetric(sparkContext, s"$name: store size"),
          s"in${i}MemtableBytes" -> SQLMetrics.createSizeMetric(sparkContext, s"$name: RocksDB memtable bytes"),
          s"in${i}DiskBytes" -> SQLMetrics.createSizeMetric(sparkContext, s"$name: RocksDB bytes on disk"),
          s"in${i}CacheHits" -> SQLMetrics.createMetric(sparkContext, s"$name: RocksDB block cache hits"),
          s"in${i}CacheMisses" -> SQLMetrics.createMetric(sparkContext, s"$name: RocksDB block cache misses"),
          s"in${i}Spills" -> SQLMetrics.createMetric(sparkContext, s"$name: stores moved to RocksDB"))
      }

  private def inputMetrics(i: Int): InputMetrics = InputMetrics(
    metrics(s"in${i}RowsIn"), metrics(s"in${i}Probes"), metrics(s"in${i}Matches"),
    metrics(s"in${i}EarlyStops"), metrics(s"in${i}StoreSize"))

  private def storeMetrics(i: Int): StoreMetrics = StoreMetrics(
    metrics(s"in${i}MemtableBytes"), metrics(s"in${i}DiskBytes"), metrics(s"in${i}CacheHits"),
    metrics(s"in${i}CacheMisses"), metrics(s"in${i}Spills"))

  override protected def doExecute(): RDD[InternalRow] = {
    val n = children.size
    val stores = UMJoinConf.from(conf).stores
    val broadcasts = children.indices.filter(broadcast).map(i => i -> InMemoryStore.broadcastOf(children(i))).toMap
    val local = children.indices.filterNot(broadcast)
    // Everything the tasks need, copied out of the plan so the closure does not capture it.
    val order = probeOrder
    val outputs = children.map(_.output)
    val boundStoreKeys = children.indices.map(i => BindReferences.bindReferences(storeKeys(i), outputs(i)))
    val prefixes = order.indices.map(p => order.take(p + 1).flatMap(outputs))
    val keyExprs = probeKeys
    val conds = conditions
    val resultAttrs = output
    val allMetrics = children.indices.map(inputMetrics)
    val allStoreMetrics = children.indices.map(storeMetrics)
    val numOutputRows = metrics("numOutputRows")

    new ZippedInputsRDD[InternalRow, InternalRow](local.map(children(_).execute()), { (context, iterators) =>
      val rowsOf = local.zip(iterators).toMap
      def conditionAt(input: Int, attrs: Seq[Attribute]): BasePredicate =
        if (conds(input).isEmpty) null
        else {
          val p = Predicate.create(conds(input).reduce(And), attrs)
          p.initialize(context.partitionId())
          p
        }
      val steps = order.indices.tail.map { p =>
        val input = order(p)
        val store = broadcasts.get(input) match {
          case Some(b) => InMemoryStore.fromBroadcast(b)
          case None =>
            JoinStores.build(stores, countRows(rowsOf(input), allMetrics(input).rowsIn), boundStoreKeys(input),
              outputs(input), input, context, allStoreMetrics(input))
        }
        allMetrics(input).storeSize += store.sizeInBytes
        new ProbeStep(store, UnsafeProjection.create(keyExprs(input), prefixes(p - 1)), conditionAt(input, prefixes(p)), allMetrics(input))
      }.toArray
      val core = new ProbeCore(steps, conditionAt(order.head, outputs(order.head)), allMetrics(order.head),
        UnsafeProjection.create(resultAttrs, prefixes(n - 1)), numOutputRows, context)
      core.join(rowsOf(order.head))
    })
  }

  private def countRows(rows: Iterator[InternalRow], counter: SQLMetric): Iterator[InternalRow] =
    rows.map { r => counter += 1; r }

  override def simpleString(maxFields: Int): String = {
    val inputs = children.indices.map(i => s"#$i ${inputLabels(i)} (${placement(i)})").mkString(", ")
    val order = probeOrder.map(i => s"#$i").mkString(" -> ")
    val conds = if (conditions.forall(_.isEmpty)) "" else s", conditions=[${conditionText(maxFields)}]"
    s"$nodeName inputs=[$inputs], joinKeys=[${joinKeyText(maxFields)}], probeOrder=[$order]$conds"
  }

  override def verboseStringWithOperatorId(): String = {
    val lines = Seq(
      s"Inputs [${children.size}]: " + children.indices.map(i => s"#$i ${inputLabels(i)} (${placement(i)})").mkString(", "),
      s"Probe order: ${probeOrder.map(i => s"#$i ${inputLabels(i)}").mkString(" -> ")}",
      s"Join keys: ${joinKeyText(Int.MaxValue)}") ++
      (if (conditions.forall(_.isEmpty)) Nil else Seq(s"Conditions: ${conditionText(Int.MaxValue)}"))
    (s"$formattedNodeName" +: lines).mkString("\n") + "\n"
  }

  /** The node as the Python side reads it (TreeNode.toJSON cannot render these fields itself). */
  override def jsonFields: List[JField] = List(
    "class" -> JString(getClass.getName),
    "num-children" -> JInt(children.length),
    "output" -> JArray(output.map(a => JString(a.toString)).toList),
    "probeOrder" -> JArray(probeOrder.map(i => JInt(i)).toList),
    "inputs" -> JArray(children.indices.map { i =>
      JObject(
        "label" -> JString(inputLabels(i)),
        "placement" -> JString(if (i == streamed) "streamed" else if (broadcast(i)) "broadcast" else "partitioned"),
        "partitionKey" -> partitionKeys(i).map(k => JString(k.toString)).getOrElse(JNull),
        "storeKeys" -> JArray(storeKeys(i).map(e => JString(e.toString)).toList),
        "probeKeys" -> JArray(probeKeys(i).map(e => JString(e.toString)).toList),
        "conditions" -> JArray(conditions(i).map(e => JString(e.toString)).toList))
    }.toList))

  private def placement(i: Int): String =
    if (i == streamed) "streamed" + partitionKeys(i).map(k => s", partitioned by $k").getOrElse("")
    else if (broadcast(i)) "broadcast"
    else s"partitioned by ${partitionKeys(i).get}"

  private def joinKeyText(maxFields: Int): String =
    probeOrder.tail.map { i =>
      val pairs = storeKeys(i).zip(probeKeys(i)).map { case (s, p) => s"$s = $p" }
      s"#$i: ${pairs.mkString(" AND ")}"
    }.take(maxFields).mkString("; ")

  private def conditionText(maxFields: Int): String =
    probeOrder.filter(conditions(_).nonEmpty).map(i => s"#$i: ${conditions(i).mkString(" AND ")}").take(maxFields).mkString("; ")

  override protected def withNewChildrenInternal(newChildren: IndexedSeq[SparkPlan]): UMJoinExec =
    copy(children = newChildren)
}

object UMJoinExec {
  /** What a broadcast input must be delivered as: Spark's hashed relation on the input's store key. */
  def broadcastDistribution(storeKeys: Seq[Expression], inputOutput: Seq[Attribute]): BroadcastDistribution =
    BroadcastDistribution(HashedRelationBroadcastMode(BindReferences.bindReferences(storeKeys, inputOutput)))
}
