package umjoin.spark.streaming

import java.util.IdentityHashMap

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.catalyst.planning.ExtractEquiJoinKeys
import org.apache.spark.sql.catalyst.plans.logical.{EventTimeWatermark, Filter, Join, LeafNode,
  LogicalPlan, Project, ReturnAnswer, Statistics, SubqueryAlias, Union}
import org.apache.spark.sql.execution.{FilterExec, PlanLater, ProjectExec, SparkPlan, SparkStrategy}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.operators.stateful.join.
  StreamingSymmetricHashJoinHelper.JoinConditionSplitPredicates
import org.apache.spark.sql.execution.streaming.runtime.{IncrementalExecution, MicroBatchExecution}
import org.apache.spark.sql.execution.umjoin.ActiveQueries
import org.apache.spark.sql.classic.{SparkSession => ClassicSession}

import umjoin.spark.UMJoinConf
import umjoin.spark.core.tsc.StreamJoinMember

/**
 * A group the streaming planner converted, in the logical plan: planned as `physical` (a
 * StreamingUMJoin over its inputs, still to be planned).
 */
final case class PlannedStreamingGroup(physical: SparkPlan, output: Seq[Attribute])
  extends LeafNode {
  override def isStreaming: Boolean = true
  override def computeStats(): Statistics = Statistics(sizeInBytes = conf.defaultSizeInBytes)
}

/**
 * Plans the stream-stream joins of a micro-batch before Spark does: at the root of the batch's
 * logical plan, every stream-stream join becomes a [[StreamJoinMember]] (a description, never
 * planned as Spark's join), TSC groups them as [[StreamingUMJoinRule]] does, and each group
 * converted is planned as a StreamingUMJoin over its inputs; the rest of the plan, and every join
 * not converted, Spark plans as without UMJoin. The StreamingUMJoin gets its operator id from the
 * micro-batch's own counter, one id per stream-stream join reserved in plan order before Spark
 * numbers its operators, so ids are the same in every micro-batch and cannot collide with Spark's.
 */
final class StreamingPlannerStrategy(session: SparkSession, rule: StreamingUMJoinRule)
  extends SparkStrategy {
  import StreamingPlannerStrategy._

  override def apply(plan: LogicalPlan): Seq[SparkPlan] = plan match {
    case planned: PlannedStreamingGroup => Seq(planned.physical)
    case ReturnAnswer(root) if root.isStreaming && hasStreamJoin(root) =>
      currentExecution.flatMap { ie =>
        val (firstBatch, operators) = startOf(ie)
        val umjoinState = operators.collect { case (id, UMJoinName) => id }
        if (!UMJoinConf.from(session.sessionState.conf).enabled) {
          // Spark's own restart check would fail first, naming operators only.
          umjoinState.minOption.foreach(id =>
            throw StreamingUMJoinRule.umjoinStateUnread(ie.checkpointLocation, id))
          None
        } else if (!plannable(root)) None
        // State that Spark's joins wrote (without UMJoin, or converted after Spark planned them,
        // as the physical rule does): that rule continues it, or says why not.
        else if (umjoinState.isEmpty && operators.values.exists(_ == SparkJoinName)) None
        else planGroups(root, ie, ie.currentBatchId == firstBatch)
      }.map(r => Seq(planLater(r))).getOrElse(Nil)
    case _ => Nil
  }

  /**
   * The run's first micro-batch, and the stateful operators the checkpoint's metadata named then
   * (read once per run).
   */
  private def startOf(ie: IncrementalExecution): (Long, Map[Long, String]) = {
    val started = StreamingRun.of(session, ie.runId).started
    started.compareAndSet(null, (ie.currentBatchId,
      OperatorCheckpoint.operatorsIn(ie.checkpointLocation, session.sessionState.newHadoopConf())))
    started.get
  }

  private def isStreamJoin(p: LogicalPlan): Boolean = p match {
    case j: Join => j.left.isStreaming && j.right.isStreaming
    case _ => false
  }

  private def hasStreamJoin(root: LogicalPlan): Boolean = root.exists(isStreamJoin)

  /**
   * What this planner takes on for now: stream-stream joins whose inputs keep no state of their own
   * and no stream-static join (those queries Spark plans, and the physical rule converts).
   */
  private def plannable(root: LogicalPlan): Boolean =
    !root.exists { case j: Join => j.left.isStreaming != j.right.isStreaming; case _ => false } &&
      root.collect { case j: Join if isStreamJoin(j) => Seq(j.left, j.right) }.flatten
        .forall(side => !side.exists {
          case _: Join | _: Project | _: Filter | _: EventTimeWatermark | _: LeafNode |
               _: Union | _: SubqueryAlias => false
          case other => other.isStreaming
        })

  private def currentExecution: Option[IncrementalExecution] = {
    val sc = session.sparkContext
    for {
      identity <- MicroBatchIdentity.current(session)
      classic <- Option(session).collect { case c: ClassicSession => c }
      queryId <- Option(sc.getLocalProperty(
        org.apache.spark.sql.execution.streaming.runtime.StreamExecution.QUERY_ID_KEY))
      query <- ActiveQueries.byId(classic, java.util.UUID.fromString(queryId))
      micro <- Option(query).collect { case m: MicroBatchExecution => m }
      context <- Option(micro.getLatestExecutionContext())
      ie <- Option(context.executionPlan)
      if ie.currentBatchId == identity.batchId
    } yield ie
  }

  /**
   * The plan with the groups of each join region (a tree of stream-stream joins and the projections
   * and filters between them) planned, or None when no group converts.
   */
  private def planGroups(root: LogicalPlan, ie: IncrementalExecution, firstOfRun: Boolean)
      : Option[LogicalPlan] = {
    def startsRegion(l: LogicalPlan): Boolean = l match {
      case j: Join => isStreamJoin(j)
      case p: Project => startsRegion(p.child)
      case f: Filter => startsRegion(f.child)
      case _ => false
    }
    var converted = false
    def visit(l: LogicalPlan): LogicalPlan =
      if (startsRegion(l)) {
        planRegion(l, ie, firstOfRun).map { r => converted = true; r }.getOrElse(l)
      } else l.mapChildren(visit)
    val rewritten = visit(root)
    Option.when(converted)(rewritten)
  }

  private def planRegion(root: LogicalPlan, ie: IncrementalExecution, firstOfRun: Boolean)
      : Option[LogicalPlan] = {
    val now = ie.offsetSeqMetadata.batchWatermarkMs
    val before = ie.prevOffsetSeqMetadata.map(_.batchWatermarkMs).getOrElse(0L)
    val logicalOf = new IdentityHashMap[SparkPlan, LogicalPlan]()
    // Each stand-in with its output watermarks (this batch's, the batch before's), as Spark's
    // simulation gives them.
    def standIn(l: LogicalPlan): (SparkPlan, Option[Long], Option[Long]) = {
      val (node, wNow, wBefore) = l match {
        case j @ ExtractEquiJoinKeys(joinType, leftKeys, rightKeys, other, _, left, right, _)
            if isStreamJoin(j) =>
          val (ls, lNow, lBefore) = standIn(left)
          val (rs, rNow, rBefore) = standIn(right)
          val inNow = (lNow ++ rNow).minOption
          val inBefore = (lBefore ++ rBefore).minOption
          // Spark's simulator gives every operator a global watermark of 0 (none yet) as it is.
          def input(global: Long, propagated: Option[Long]): Some[Long] =
            Some(if (global == 0) 0L else propagated.getOrElse(global))
          val member = StreamJoinMember(leftKeys, rightKeys, joinType,
            JoinConditionSplitPredicates(other, ls, rs), input(before, inBefore),
            input(now, inNow), ls, rs)
          (member, inNow.flatMap(member.produceOutputWatermark),
            inBefore.flatMap(member.produceOutputWatermark))
        case p: Project =>
          val (c, a, b) = standIn(p.child)
          (ProjectExec(p.projectList, c), a, b)
        case f: Filter =>
          val (c, a, b) = standIn(f.child)
          (FilterExec(f.condition, c), a, b)
        case other =>
          val marked = other.exists(_.isInstanceOf[EventTimeWatermark])
          (PlanLater(other), Option.when(marked)(now), Option.when(marked)(before))
      }
      logicalOf.put(node, l)
      (node, wNow, wBefore)
    }
    val tree = standIn(root)._1
    // One id per stream-stream join, in plan order, taken from the micro-batch's counter (and
    // given back if no group converts: Spark's joins then get the ids they get without UMJoin).
    val joins = tree.collect { case j: StreamJoinMember => j }
    val ids = new IdentityHashMap[SparkPlan, StatefulOperatorStateInfo]()
    joins.foreach(j => ids.put(j, StreamingPlannerStrategy.nextStateInfo(ie)))
    def operatorOf(groupRoot: SparkPlan): Option[StatefulOperatorStateInfo] =
      groupRoot.collectFirst { case j: StreamJoinMember => ids.get(j) }
    // An input measured on the first micro-batch runs as Spark plans it.
    def runnable(input: SparkPlan): SparkPlan =
      input.transformUp { case later: PlanLater => ie.planner.plan(later.plan).next() }
    val marked = root.exists(_.isInstanceOf[EventTimeWatermark])
    val groups = rule.plannedGroups(tree, operatorOf, joins.map(ids.get), firstOfRun, ie.runId,
      runnable, Option.when(marked)(now))
    if (groups.isEmpty) {
      StreamingPlannerStrategy.giveBack(ie, joins.size)
      None
    }
    else {
      val byRoot = new IdentityHashMap[LogicalPlan, (Seq[SparkPlan] => SparkPlan, Seq[SparkPlan])]()
      groups.foreach { case (groupRoot, inputs, build) =>
        byRoot.put(logicalOf.get(groupRoot), (build, inputs))
      }
      def rewrite(l: LogicalPlan): LogicalPlan = Option(byRoot.get(l)) match {
        case Some((build, inputs)) =>
          PlannedStreamingGroup(build(inputs.map(i => PlanLater(rewrite(logicalOf.get(i))))),
            l.output)
        case None => l.mapChildren(rewrite)
      }
      Some(rewrite(root))
    }
  }
}

object StreamingPlannerStrategy {
  /**
   * The next operator's state from the micro-batch's counter (Scala-private in Spark: reached by
   * its compiled name).
   */
  private def nextStateInfo(ie: IncrementalExecution): StatefulOperatorStateInfo = {
    val method = classOf[IncrementalExecution].getMethod("org$apache$spark$sql$execution$" +
      "streaming$runtime$IncrementalExecution$$nextStatefulOperationStateInfo")
    method.invoke(ie).asInstanceOf[StatefulOperatorStateInfo]
  }

  /** Gives the micro-batch's counter back the last `count` ids taken (none taken since). */
  private def giveBack(ie: IncrementalExecution, count: Int): Unit = {
    val field = classOf[IncrementalExecution].getDeclaredField("statefulOperatorId")
    field.setAccessible(true)
    field.get(ie).asInstanceOf[java.util.concurrent.atomic.AtomicInteger].addAndGet(-count)
  }

  private val UMJoinName = StreamingUMJoinExec.ShortName
  /** Spark's stream-stream join's `shortName`, as its metadata names it. */
  private val SparkJoinName = "symmetricHashJoin"
}
