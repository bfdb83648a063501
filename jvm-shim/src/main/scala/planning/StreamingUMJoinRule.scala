package umjoin.spark.planning

import java.util.IdentityHashMap

import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.expressions.{EqualTo, Expression, PredicateHelper}
import org.apache.spark.sql.catalyst.plans.physical.HashPartitioning
import org.apache.spark.sql.catalyst.rules.Rule
import org.apache.spark.sql.execution.{FileSourceScanExec, FilterExec, SparkPlan}
import org.apache.spark.sql.execution.exchange.ShuffleExchangeExec
import org.apache.spark.sql.execution.streaming.operators.stateful.join.StreamingSymmetricHashJoinExec
import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.apache.spark.sql.types.{ByteType, IntegerType, LongType, ShortType}

import umjoin.spark.UMJoinConf
import umjoin.spark.exec.{StreamingUMJoinExec, StreamingUMJoinMemberExec}
import umjoin.spark.tsc.{MemberPatterns, MultiJoinGroup, TwoStepConvert}

/** What a streaming group runs with (see [[StreamingUMJoinExec]] for the fields). */
final case class StreamingGroupPlan(
    graph: JoinGraph,
    sharedClass: Int,
    keys: Seq[Expression],
    lateRows: Seq[Option[Expression]],
    evictable: Seq[Option[Expression]],
    evictionWatermark: Option[Long])

/**
 * The streaming hook: a physical rule run on every micro-batch's plan after Spark gave its
 * stream-stream joins their state (operator ids, checkpoint, partitions, watermarks) and inserted
 * their exchanges. TSC runs on this physical plan with the member patterns of `rules/streaming.yaml`;
 * every group whose streams all share one join key class becomes one StreamingUMJoin, which keeps
 * the root join's state identity (operator id) and, through [[StreamingUMJoinMemberExec]], the other
 * joins' ids for Spark's watermark bookkeeping. Groups without such a key are split; what cannot be
 * converted keeps Spark's joins. The rule does the same in every batch and after a restart, so a
 * query keeps its state layout.
 *
 * Why a physical rule and not a rewrite into Spark's own stateful machinery: Spark plans stream-stream
 * joins with its own strategy before any extension strategy and assigns state only to its built-in
 * operators, so the only place that sees the joins together with their state is the prepared plan.
 */
final class StreamingUMJoinRule(session: SparkSession, patterns: MemberPatterns[SparkPlan])
  extends Rule[SparkPlan] with PredicateHelper with Logging {

  private val tsc = new TwoStepConvert[SparkPlan](patterns.roleOf)

  override def apply(plan: SparkPlan): SparkPlan =
    if (!plan.exists(_.isInstanceOf[StreamingSymmetricHashJoinExec])) plan
    else {
      val conf = UMJoinConf.from(session.sessionState.conf)
      val accepted =
        if (conf.enabled) GroupSplitting.acceptedGroups[SparkPlan, StreamingGroupPlan](plan, tsc, patterns.roleOf, conf.minInputs, tryPlan, (_, _, _) => None)
        else Nil
      val plans = new IdentityHashMap[SparkPlan, StreamingGroupPlan]()
      accepted.foreach { case (group, p) => plans.put(group.root, p) }
      checkCheckpoint(plan, plans)
      tsc.getMultiJoinNode(plan, accepted.map(_._1), (group, inputs) => build(group, plans.get(group.root), inputs, conf))
    }

  /**
   * A query restarted from a checkpoint keeps the state layout it was written with: a join tree's
   * state is either UMJoin's (one store per input, under the root join's operator id) or Spark's.
   * Reading one as the other would fail obscurely, or worse; this names the problem instead.
   */
  private def checkCheckpoint(plan: SparkPlan, convertedRoots: IdentityHashMap[SparkPlan, StreamingGroupPlan]): Unit = {
    lazy val hadoopConf = session.sessionState.newHadoopConf()
    plan.foreach {
      case join: StreamingSymmetricHashJoinExec if join.stateInfo.exists(_.storeVersion > 0) =>
        val info = join.getStateInfo
        val store = StateStoreId(info.checkpointLocation, info.operatorId, 0, StreamingUMJoinExec.storeName(0)).storeCheckpointLocation()
        val hasUMJoinState = store.getFileSystem(hadoopConf).exists(store)
        val isUMJoin = convertedRoots.containsKey(join)
        if (isUMJoin && !hasUMJoinState) {
          throw new IllegalStateException(s"The checkpoint ${info.checkpointLocation} holds Spark's stream-stream join state " +
            s"for operator ${info.operatorId}, written without UMJoin; UMJoin cannot continue it. Restart with " +
            s"spark.umjoin.enabled=false, or use a new checkpoint location to run this query with UMJoin.")
        }
        if (!isUMJoin && hasUMJoinState) {
          throw new IllegalStateException(s"The checkpoint ${info.checkpointLocation} holds StreamingUMJoin state for operator " +
            s"${info.operatorId}, but this run plans Spark's stream-stream joins there (spark.umjoin.enabled is false, or the " +
            s"join no longer converts). Restart with the settings the checkpoint was written with, or use a new checkpoint location.")
        }
      case _ =>
    }
  }

  /** The plan of a group, or why it cannot run as one StreamingUMJoin. */
  private def tryPlan(group: MultiJoinGroup[SparkPlan]): Either[String, StreamingGroupPlan] = {
    val joins = group.members.collect { case j: StreamingSymmetricHashJoinExec => j }
    val conjuncts = group.members.flatMap {
      case j: StreamingSymmetricHashJoinExec =>
        j.leftKeys.zip(j.rightKeys).map { case (l, r) => EqualTo(l, r) } ++ j.condition.full.toSeq.flatMap(splitConjunctivePredicates)
      case f: FilterExec => splitConjunctivePredicates(f.condition)
      case _ => Nil
    }
    val inputs = group.inputs
    val outputs = inputs.map(_.output)
    JoinGraph.build(outputs, conjuncts, group.root.output).flatMap { graph =>
      // Every stream's state is partitioned by one key: the class all streams join on.
      val shared = graph.classes.indices.filter(c => inputs.indices.forall(graph.classes(c).inputs.contains))
        .sortBy(c => (-graph.classes(c).members.size, !Seq(ByteType, ShortType, IntegerType, LongType).contains(graph.classes(c).members.head._2.dataType)))
      shared.headOption.toRight("its streams do not all share one join key, which a streaming UMJoin partitions its state by").map { sharedClass =>
        val evictionWatermark = joins.flatMap(_.eventTimeWatermarkForEviction).minOption
        StreamingGroupPlan(
          graph = graph,
          sharedClass = sharedClass,
          keys = inputs.indices.map(i => graph.classes(sharedClass).keyOf(i).get),
          lateRows = inputs.indices.map { i =>
            StreamingWatermarks.lateRows(outputs(i), joinAbove(group, inputs(i)).eventTimeWatermarkForLateEvents)
          },
          evictable = inputs.indices.map(i => StreamingWatermarks.evictableRows(i, outputs, graph.classes, conjuncts, evictionWatermark)),
          evictionWatermark = evictionWatermark)
      }
    }
  }

  /** The join an input feeds directly (through projections and filters): it decides the input's late rows. */
  private def joinAbove(group: MultiJoinGroup[SparkPlan], input: SparkPlan): StreamingSymmetricHashJoinExec = {
    val parent = group.members.find(_.children.exists(_ eq input)).get
    parent match {
      case j: StreamingSymmetricHashJoinExec => j
      case passThrough => joinAbove(group, passThrough)
    }
  }

  private def build(group: MultiJoinGroup[SparkPlan], plan: StreamingGroupPlan, inputs: Seq[SparkPlan], conf: UMJoinConf): SparkPlan = {
    val root = group.root.asInstanceOf[StreamingSymmetricHashJoinExec]
    val partitions = root.getStateInfo.numPartitions
    val umjoin = StreamingUMJoinExec(
      output = root.output,
      inputLabels = inputs.map(label),
      keys = plan.keys,
      classInputs = plan.graph.classes.map(_.members.map(_._1)),
      classKeys = plan.graph.classes.map(_.members.map(_._2)),
      residuals = plan.graph.residuals.map(_.condition),
      residualInputs = plan.graph.residuals.map(_.inputs.toSeq.sorted),
      sharedClass = plan.sharedClass,
      probeOrder = conf.probeOrder,
      lateRows = plan.lateRows,
      evictable = plan.evictable,
      stateTtlMs = conf.stateTtlMs,
      stateInfo = root.stateInfo,
      eventTimeWatermarkForEviction = plan.evictionWatermark,
      children = inputs.zip(plan.keys).map { case (input, key) => partitionedBy(input, key, partitions) })
    logInfo(s"UMJoin: ${group.members.count(_.isInstanceOf[StreamingSymmetricHashJoinExec])} stream-stream joins become ${umjoin.simpleString(10)}")
    group.members.collect { case j: StreamingSymmetricHashJoinExec if j ne root => j }
      .foldLeft(umjoin: SparkPlan)((child, replaced) => StreamingUMJoinMemberExec(replaced.stateInfo, child))
  }

  /** The input hash-partitioned on its key into the state's partitions (Spark's exchange kept if it already is). */
  private def partitionedBy(input: SparkPlan, key: Expression, partitions: Int): SparkPlan = input match {
    case e: ShuffleExchangeExec => e.outputPartitioning match {
      case HashPartitioning(Seq(k), `partitions`) if k.semanticEquals(key) => e
      case _ => ShuffleExchangeExec(HashPartitioning(Seq(key), partitions), e.child)
    }
    case other => ShuffleExchangeExec(HashPartitioning(Seq(key), partitions), other)
  }

  /** The stream an input reads: its files' directory (a file source), else its leaf's name. */
  private def label(input: SparkPlan): String = input.collectLeaves().map {
    case scan: FileSourceScanExec =>
      scan.relation.location.rootPaths.headOption.map(p => Option(p.getParent).map(_.getName).getOrElse(p.getName)).getOrElse("files")
    case leaf => leaf.nodeName
  }.distinct.mkString("+")
}
