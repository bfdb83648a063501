package umjoin.spark.streaming

import java.util.UUID

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path

import org.apache.spark.internal.Logging
import org.apache.spark.rdd.RDD
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Alias, Attribute, Expression, JoinedRow,
  Literal, Predicate, UnsafeProjection}
import org.apache.spark.sql.catalyst.plans.Inner
import org.apache.spark.sql.catalyst.plans.logical.{EventTimeWatermark, Filter, Join, LogicalPlan,
  Project, RepartitionByExpression, UnaryNode}
import org.apache.spark.sql.classic.{SparkSession => ClassicSession}
import org.apache.spark.sql.execution.{SparkPlan, UnaryExecNode}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.operators.stateful.join.{
  JoinStateManagerStoreGenerator, StreamingSymmetricHashJoinExec,
  StreamingSymmetricHashJoinHelper, SymmetricHashJoinStateManager}
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec,
  OperatorStateMetadataWriter, StateSchemaBroadcast, StateStore, StateStoreConf,
  StateStoreProvider, StateStoreProviderId}
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.StructType
import org.apache.spark.util.SerializableConfiguration

import umjoin.spark.core.ZippedInputsRDD

/**
 * The join region of a micro-batch in which Spark's stream-stream joins take a StreamingUMJoin's
 * state back (the query restarted with UMJoin off); planned as [[SparkJoinTakeBackExec]] over
 * Spark's joins.
 */
final case class SparkJoinsTakingBack(child: LogicalPlan, umjoinOperator: Long,
    stateLocation: String, batchId: Long) extends UnaryNode {
  override def output: Seq[Attribute] = child.output
  override protected def withNewChildInternal(c: LogicalPlan): SparkJoinsTakingBack =
    copy(child = c)
}

/**
 * Spark's joins (`child`) that first write their state from the StreamingUMJoin's stores, once:
 * the micro-batch `batchId` that switches a query back from UMJoin (issue 68). `region` is the
 * joins' logical plan, whose inputs' rows the StreamingUMJoin of `umjoinOperator` holds (in
 * `stateLocation`, the checkpoint's state directory).
 */
final case class SparkJoinTakeBackExec(region: LogicalPlan, umjoinOperator: Long,
    stateLocation: String, batchId: Long, child: SparkPlan) extends UnaryExecNode {
  override def output: Seq[Attribute] = child.output
  override def outputPartitioning = child.outputPartitioning

  override protected def doExecute(): RDD[InternalRow] = {
    val joins = child.collect { case j: StreamingSymmetricHashJoinExec => j }
    SparkJoinTakeBack.writeState(session, region, umjoinOperator, stateLocation, batchId, joins)
    child.execute()
  }

  override protected def withNewChildInternal(c: SparkPlan): SparkJoinTakeBackExec =
    copy(child = c)
}

object SparkJoinTakeBack extends Logging {

  /**
   * Why Spark's joins cannot take the state of the StreamingUMJoin that `operators` (the
   * checkpoint's stateful operators) name back in the micro-batch `root`, or None. What is taken
   * back: a query's only StreamingUMJoin, of one stream and static tables (Spark's joins of a
   * stream with a table keep no state), or of inner joins of streams without watermarks on
   * RocksDB (its stores start at a later version), what a take-over takes over.
   */
  def refusal(root: LogicalPlan, operators: Map[Long, String], conf: SQLConf): Option[String] = {
    val joins = root.collect { case j: Join => j }
    val regions = regionRoots(root)
    if (operators.size != 1) {
      Some(s"the checkpoint holds the state of ${operators.size} stateful operators " +
        s"(${operators.toSeq.sorted.map { case (id, name) => s"$id: $name" }.mkString(", ")}); " +
        "Spark's joins take back the state of a StreamingUMJoin that is a query's only one")
    } else if (!joins.exists(isStreamJoin)) {
      None
    } else if (StoreLayout.forSession(conf) == StoreLayout.Separate) {
      Some("Spark's HDFS-backed state store cannot start Spark's join stores at a later version")
    } else if (root.exists(_.isInstanceOf[EventTimeWatermark])) {
      Some("the query has watermarks: rows Spark's joins evicted would have to be told apart " +
        "from rows they keep")
    } else if (!joins.forall(isStreamJoin)) {
      Some("a stream is joined with a static table beside the stream-stream joins")
    } else if (joins.exists(_.joinType != Inner)) {
      Some(s"it has ${joins.map(_.joinType).filter(_ != Inner).map(_.sql).distinct
        .mkString(" and ")} joins; Spark's joins take back inner joins' state")
    } else if (regions.size != 1) {
      Some(s"its stream-stream joins form ${regions.size} join trees, not one")
    } else {
      inputsOf(regions.head).flatMap(leafFilters(_)._1).find(!_.deterministic)
        .map(f => s"an input's filter ${f.sql} is not deterministic")
    }
  }

  /** The error that stops a query whose StreamingUMJoin state Spark's joins cannot take back. */
  def cannotTakeBack(checkpointLocation: String, operatorId: Long, why: String)
      : IllegalStateException =
    new IllegalStateException(s"The checkpoint $checkpointLocation holds StreamingUMJoin state " +
      s"for operator $operatorId and UMJoin is off (spark.umjoin.enabled=false), but Spark's " +
      s"joins cannot take that state back: $why. Restart with spark.umjoin.enabled=true to " +
      "continue the query, or use a new checkpoint location to run it with Spark's joins.")

  /** `root` with its join regions under [[SparkJoinsTakingBack]]. */
  def marked(root: LogicalPlan, umjoinOperator: Long, stateLocation: String,
      batchId: Long): LogicalPlan = {
    def visit(l: LogicalPlan): LogicalPlan =
      if (startsRegion(l)) SparkJoinsTakingBack(l, umjoinOperator, stateLocation, batchId)
      else l.mapChildren(visit)
    visit(root)
  }

  private def isStreamJoin(j: Join): Boolean = j.left.isStreaming && j.right.isStreaming

  /**
   * Whether a join region starts at `l`: a join of a stream, under any projections and filters
   * (the planner's groups and the take-back both work region by region).
   */
  def startsRegion(l: LogicalPlan): Boolean = l match {
    case j: Join => j.isStreaming
    case p: Project => startsRegion(p.child)
    case f: Filter => startsRegion(f.child)
    case _ => false
  }

  private def regionRoots(l: LogicalPlan): Seq[LogicalPlan] =
    if (startsRegion(l)) Seq(l) else l.children.flatMap(regionRoots)

  /** The inputs of the join tree under `plan`, left to right: what a StreamingUMJoin stores. */
  private def inputsOf(plan: LogicalPlan): Seq[LogicalPlan] = plan match {
    case j: Join => inputsOf(j.left) ++ inputsOf(j.right)
    case p @ (_: Project | _: Filter) if startsRegion(p) => inputsOf(p.children.head)
    case other => Seq(other)
  }

  /** An input's filters, outermost first, and what they filter. */
  private def leafFilters(input: LogicalPlan): (Seq[Expression], LogicalPlan) = input match {
    case Filter(condition, child) =>
      val (more, under) = leafFilters(child)
      (condition +: more, under)
    case other => (Nil, other)
  }

  /**
   * Writes the state of Spark's `joins` (the micro-batch's, in plan order, as Spark numbered
   * them) from the StreamingUMJoin's stores, unless they hold it already (an earlier execution of
   * the same micro-batch). Each join side's rows are the side's plan over the stored inputs'
   * rows, as Spark's join would hold them after the same micro-batches (inner joins without
   * watermarks keep every row that passes the side's own condition), placed by the join's key
   * and appended with Spark's own state manager into stores started empty at the version before
   * the micro-batch's; matched flags set by Spark's own lookup. Then the operators' schemas and
   * metadata are Spark's (the StreamingUMJoin's replaced: the commit point), and the
   * StreamingUMJoin's stores, record and schema move to `<checkpoint>/umjoin/taken-back-<batch>`.
   */
  def writeState(session: ClassicSession, region: LogicalPlan, umjoinOperator: Long,
      stateLocation: String, batchId: Long, joins: Seq[StreamingSymmetricHashJoinExec]): Unit = {
    val hadoopConf = session.sessionState.newHadoopConf()
    val checkpoint = new OperatorCheckpoint(StatefulOperatorStateInfo(stateLocation,
      UUID.randomUUID(), umjoinOperator, batchId, 0), hadoopConf)
    if (!checkpoint.hasLayout || !OperatorCheckpoint.operatorsIn(stateLocation, hadoopConf)
        .get(umjoinOperator).contains(StreamingUMJoinExec.ShortName)) return
    if (joins.isEmpty) {
      // A group of one stream and static tables: Spark's joins of a stream with a table keep no
      // state; the StreamingUMJoin's metadata removed (the commit point) is all Spark's check
      // at the next restart needs.
      checkpoint.markTakeBack()
      val away = checkpoint.awayForTakeBack()
      checkpoint.moveSchemaAway(away)
      checkpoint.moveMetadataAway(away)
      checkpoint.moveStoresAway(away)
      logInfo(s"UMJoin: Spark's joins of a stream with static tables replace the " +
        s"StreamingUMJoin of operator $umjoinOperator from micro-batch $batchId on (they keep " +
        s"no state); its state now is in $away")
      return
    }
    val infos = joins.map(_.stateInfo.getOrElse(
      throw new IllegalStateException("UMJoin: a stream-stream join without its state")))
    val info = infos.find(_.operatorId == umjoinOperator).getOrElse(throw new
        IllegalStateException(s"UMJoin: Spark's joins (operators ${infos.map(_.operatorId)
          .mkString(", ")}) do not include the StreamingUMJoin's operator $umjoinOperator"))
    require(info.storeVersion == batchId,
      s"UMJoin: Spark's joins run micro-batch ${info.storeVersion}, not $batchId")
    val start = System.nanoTime()
    val logicalJoins = region.collect { case j: Join => j }
    if (logicalJoins.size != joins.size || logicalJoins.zip(joins).exists { case (l, j) =>
        l.left.output.map(_.exprId) != j.left.output.map(_.exprId) ||
          l.right.output.map(_.exprId) != j.right.output.map(_.exprId) }) {
      throw new IllegalStateException(s"UMJoin: Spark planned the joins under " +
        s"${region.nodeName} otherwise than their logical plan; their state is not taken back")
    }
    val inputs = inputsOf(region)
    val version = info.storeVersion
    val stored = inputs.zipWithIndex.map { case (input, i) =>
      storedRows(session, info, umjoinOperator, i, input, version - 1)
    }
    def overStored(plan: LogicalPlan): LogicalPlan = inputs.indexWhere(_ eq plan) match {
      case -1 => plan.mapChildren(overStored)
      case i => stored(i)
    }
    val sides = joins.flatMap { j =>
      val partitions = j.stateInfo.get.numPartitions
      def side(child: LogicalPlan, keys: Seq[Expression], own: Option[Expression]) =
        session.sessionState.executePlan(RepartitionByExpression(keys,
          own.fold(overStored(child))(Filter(_, overStored(child))), Some(partitions))).toRdd
      val logical = logicalJoins(joins.indexOf(j))
      Seq(side(logical.left, j.leftKeys, j.condition.leftSideOnly),
        side(logical.right, j.rightKeys, j.condition.rightSideOnly))
    }
    val sidesMs = (System.nanoTime() - start) / 1000000
    val storeConf = StateStoreConf(session.sessionState.conf)
    val conf = new SerializableConfiguration(hadoopConf)
    val written = session.sparkContext.longAccumulator("UMJoin: rows given back to Spark's joins")
    val specs = joins.map(JoinStateSpec.of)
    new ZippedInputsRDD[InternalRow, Unit](sides, { (context, read) =>
      specs.zipWithIndex.foreach { case (spec, k) =>
        written.add(spec.write(context.partitionId(), read(2 * k), read(2 * k + 1), storeConf,
          conf.value))
      }
      Iterator.empty
    }).foreach(_ => ())
    checkpoint.markTakeBack()
    val away = checkpoint.awayForTakeBack()
    joins.sortBy(_.stateInfo.get.operatorId != umjoinOperator).foreach { j =>
      val id = j.stateInfo.get.operatorId
      if (id == umjoinOperator) checkpoint.moveSchemaAway(away)
      // Written as a new operator's schema (batch 0): for formats 3 and 4 Spark would read the
      // schema files its metadata of a micro-batch before named, and there is none.
      val schemas = j.validateAndMaybeEvolveStateSchema(hadoopConf,
        if (j.stateFormatVersion >= 3) 0L else version, j.stateFormatVersion)
      val metadata = j.operatorStateMetadata(j.stateSchemaList(schemas, None))
      // The commit point: the StreamingUMJoin's metadata (of version 1) replaced by Spark's, or
      // removed once Spark's of version 2 is beside it (Spark's writers never overwrite).
      if (id == umjoinOperator && metadata.version == 1) {
        checkpoint.rewriteOperatorMetadata(metadata)
      } else {
        OperatorStateMetadataWriter.createWriter(new Path(info.checkpointLocation, id.toString),
          hadoopConf, metadata.version, Some(version)).write(metadata)
        if (id == umjoinOperator) checkpoint.moveMetadataV1Away(away)
      }
    }
    checkpoint.moveStoresAway(away)
    logInfo(s"UMJoin: Spark's stream-stream joins (operators ${infos.map(_.operatorId)
      .mkString(", ")}, join state format ${joins.head.stateFormatVersion}) took the state of " +
      s"the StreamingUMJoin of operator $umjoinOperator back in micro-batch $version: " +
      s"${written.value} state rows written into their stores in " +
      s"${(System.nanoTime() - start) / 1000000} ms (of which $sidesMs ms planning and running " +
      s"the join sides' queries up to their shuffles); the StreamingUMJoin's state now is in $away")
  }

  /**
   * Input `i`'s rows as the StreamingUMJoin's stores hold them after micro-batch `batchId`, with
   * the input's own attributes and under its own filters (which the stored rows passed already, or
   * pass now: a filter on an input is applied again where the group's input is below it).
   */
  private def storedRows(session: ClassicSession, info: StatefulOperatorStateInfo,
      operator: Long, i: Int, input: LogicalPlan, batchId: Long): LogicalPlan = {
    val relation = session.read.format(StoredInputSource.ShortName)
      .option("input", i.toString).option("operatorId", operator.toString)
      .option("batchId", batchId.toString)
      .load(new Path(info.checkpointLocation).getParent.toString).queryExecution.analyzed
    val columns = relation.output.init
    if (columns.map(_.dataType) != input.output.map(_.dataType)) {
      throw new IllegalStateException(s"UMJoin: the StreamingUMJoin of operator $operator " +
        s"stores input $i as (${columns.map(c => s"${c.name} ${c.dataType.sql}").mkString(", ")})" +
        s", but Spark's joins read it as (${input.output.map(c => s"${c.name} " +
          c.dataType.sql).mkString(", ")}); its state is not taken back")
    }
    val (filters, _) = leafFilters(input)
    val rows = Project(input.output.zip(columns).map { case (a, c) =>
      Alias(c, a.name)(exprId = a.exprId)
    }, relation)
    filters.foldRight(rows: LogicalPlan)((condition, under) => Filter(condition, under))
  }
}

/** What writing one of Spark's joins' state in a task needs (serializable). */
private final case class JoinStateSpec(info: StatefulOperatorStateInfo, formatVersion: Int,
    leftOutput: Seq[Attribute], rightOutput: Seq[Attribute], leftKeys: Seq[Expression],
    rightKeys: Seq[Expression], bothSides: Option[Expression]) {

  /**
   * Writes partition `partition`'s rows of both sides as the state the join reads in its
   * micro-batch (`info.storeVersion`): the right side's first, unmatched, then the left side's,
   * each looked up on the right as Spark's join looks a new row up (which marks the rows it
   * matches). The count of rows written.
   */
  def write(partition: Int, left: Iterator[InternalRow], right: Iterator[InternalRow],
      storeConf: StateStoreConf, hadoopConf: Configuration): Long = {
    val stores = new EmptyStartingStores
    val before = Some(info.copy(storeVersion = info.storeVersion - 1))
    // (A manager asks the store generator only where it "uses the coordinator"; these stores are
    // opened by the generator itself, outside the executor's loaded ones.)
    def manager(side: StreamingSymmetricHashJoinHelper.JoinSide, output: Seq[Attribute],
        keys: Seq[Expression]) = SymmetricHashJoinStateManager(side, output, keys, before,
      storeConf, hadoopConf, partition, None, None, formatVersion, None, true, None, stores,
      None, false)
    try {
      val rightState = manager(StreamingSymmetricHashJoinHelper.RightSide, rightOutput, rightKeys)
      val leftState = manager(StreamingSymmetricHashJoinHelper.LeftSide, leftOutput, leftKeys)
      val rightRow = UnsafeProjection.create(rightOutput, rightOutput)
      val rightKey = UnsafeProjection.create(rightKeys, rightOutput)
      var count = 0L
      right.foreach { r =>
        val row = rightRow(r)
        rightState.append(rightKey(row), row, false)
        count += 1
      }
      val leftRow = UnsafeProjection.create(leftOutput, leftOutput)
      val leftKey = UnsafeProjection.create(leftKeys, leftOutput)
      val condition = Predicate.create(bothSides.getOrElse(Literal.TrueLiteral),
        leftOutput ++ rightOutput)
      val joined = new JoinedRow
      left.foreach { l =>
        val row = leftRow(l)
        val key = leftKey(row)
        val matched = rightState.getJoinedRows(key, r => joined.withLeft(row).withRight(r),
          condition.eval).size > 0
        leftState.append(key, row, matched)
        count += 1
      }
      // Formats 3 and 4 keep both sides in one store (Spark commits it through the left side).
      leftState.commit()
      if (formatVersion < 3) rightState.commit()
      count
    } finally stores.close()
  }
}

private object JoinStateSpec {
  def of(j: StreamingSymmetricHashJoinExec): JoinStateSpec = JoinStateSpec(j.stateInfo.get,
    j.stateFormatVersion, j.left.output, j.right.output, j.leftKeys, j.rightKeys,
    j.condition.bothSides)
}

/**
 * The stores of one of Spark's joins in a partition, each opened empty at the version asked for
 * (RocksDB's `loadEmpty`), so that its commit writes the next version whatever the store holds;
 * outside the executor's loaded providers (closed here once written).
 */
private final class EmptyStartingStores extends JoinStateManagerStoreGenerator {
  private val opened = mutable.LinkedHashMap[StateStoreProviderId, StateStoreProvider]()
  private val stores = mutable.Map[StateStoreProviderId, StateStore]()

  override def getStore(id: StateStoreProviderId, keySchema: StructType, valueSchema: StructType,
      encoder: KeyStateEncoderSpec, version: Long, checkpointId: Option[String],
      schemas: Option[StateSchemaBroadcast], useColumnFamilies: Boolean,
      multipleValuesPerKey: Boolean, storeConf: StateStoreConf,
      hadoopConf: Configuration): StateStore = stores.getOrElseUpdate(id, {
    val provider = StateStoreProvider.createAndInit(id, keySchema, valueSchema, encoder,
      useColumnFamilies, storeConf, hadoopConf, multipleValuesPerKey, None)
    opened.put(id, provider)
    provider.getStore(version, None, true, true)
  })

  def close(): Unit = opened.values.foreach(_.close())
}
