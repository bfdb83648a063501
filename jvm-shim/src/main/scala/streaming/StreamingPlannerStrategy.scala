package umjoin.spark.streaming

import java.util.{IdentityHashMap, UUID}

import scala.util.Try

import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.catalyst.optimizer.{BuildLeft, BuildRight, JoinSelectionHelper}
import org.apache.spark.sql.catalyst.planning.ExtractEquiJoinKeys
import org.apache.spark.sql.catalyst.plans.logical.{EventTimeWatermark, Filter, Join, LeafNode,
  LogicalPlan, Project, ReturnAnswer, Statistics}
import org.apache.spark.sql.catalyst.plans.physical.IdentityBroadcastMode
import org.apache.spark.sql.execution.{FilterExec, PlanLater, ProjectExec, SparkPlan, SparkStrategy}
import org.apache.spark.sql.execution.exchange.BroadcastExchangeExec
import org.apache.spark.sql.execution.joins.{BaseJoinExec, BroadcastHashJoinExec}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.operators.stateful.join.
  StreamingSymmetricHashJoinHelper.JoinConditionSplitPredicates
import org.apache.spark.sql.execution.streaming.runtime.{IncrementalExecution, MicroBatchExecution,
  StreamExecution}
import org.apache.spark.sql.execution.umjoin.ActiveQueries
import org.apache.spark.sql.internal.SQLConf
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
 * Plans the joins of a stream in a micro-batch before Spark does: at the root of the batch's
 * logical plan, every stream-stream join becomes a [[StreamJoinMember]] (a description, never
 * planned as Spark's join) and every join of a stream with a static table the join Spark would
 * plan for it (its `JoinSelection`, over the inputs still to be planned); TSC groups them, and each
 * group converted is planned as a StreamingUMJoin over its inputs; the rest of the plan, and every
 * join not converted, Spark plans as without UMJoin. A StreamingUMJoin takes the place of
 * Spark's stream-stream joins in the checkpoint: its operator id comes from the micro-batch's own
 * counter, one id per stream-stream join reserved in plan order before Spark numbers its
 * operators, so ids are the same in every micro-batch and cannot collide with Spark's. A group of
 * one stream and static tables replaces joins Spark keeps no state for: its id is one of
 * [[StaticGroupIds]] on, which no operator of Spark's takes, so Spark's operators keep the ids
 * they have without UMJoin whether or not it converts.
 */
final class StreamingPlannerStrategy(session: SparkSession, groups: StreamingGroupPlanner)
  extends SparkStrategy with JoinSelectionHelper with Logging {
  import StreamingPlannerStrategy._

  override def apply(plan: LogicalPlan): Seq[SparkPlan] = plan match {
    case planned: PlannedStreamingGroup => Seq(planned.physical)
    case SparkJoinsTakingBack(region, id, stateLocation, batchId) =>
      Seq(SparkJoinTakeBackExec(region, id, stateLocation, batchId, planLater(region)))
    case ReturnAnswer(root) if root.isStreaming && root.exists(isJoinOfAStream) =>
      currentExecution.flatMap { ie =>
        val run = StreamingRun.of(session, ie.runId)
        def note(message: String): Unit = if (run.firstNote(message)) logInfo(s"UMJoin: $message")
        val (firstBatch, operators) = startOf(ie, run)
        val firstOfRun = ie.currentBatchId == firstBatch
        val umjoinState = operators.collect { case (id, UMJoinName) => id }
        val sparkJoinState = operators.collect { case (id, SparkJoinName) => id }.toSeq.sorted
        if (!UMJoinConf.from(session.sessionState.conf).enabled) {
          umjoinState.headOption.map { id =>
            SparkJoinTakeBack.refusal(root, operators, session.sessionState.conf).foreach(why =>
              throw SparkJoinTakeBack.cannotTakeBack(ie.checkpointLocation, id, why))
            if (firstOfRun) {
              // Spark checks a restarted query's operators against this micro-batch's plan.
              note(s"UMJoin is off, and this run's first micro-batch continues the " +
                s"StreamingUMJoin of operator $id whose state the checkpoint " +
                s"${ie.checkpointLocation} holds (Spark checks a restarted query's operators " +
                "against that micro-batch's plan); Spark's joins take its state back in the next")
              planGroups(root, ie, firstOfRun, None).getOrElse(
                throw StreamingGroupPlanner.umjoinStateUnread(ie.checkpointLocation, id))
            } else SparkJoinTakeBack.marked(root, id, ie.checkpointLocation, ie.currentBatchId)
          }
        } else if (umjoinState.isEmpty && sparkJoinState.nonEmpty && firstOfRun) {
          // State that Spark's joins wrote: they run the run's first micro-batch as they ran
          // (Spark checks the checkpoint's operators against that micro-batch's plan); a group
          // may take their state over in the next.
          sparkJoinState.foreach(refuseEarlierUMJoinState(ie, _))
          note(s"the joins of this query stay as Spark planned them in this run's first " +
            s"micro-batch: the checkpoint ${ie.checkpointLocation} holds the state of operator " +
            s"${sparkJoinState.mkString(", ")}, written when its join ran as Spark's join, and " +
            "Spark checks a restarted query's operators against that micro-batch's plan; a " +
            "StreamingUMJoin takes their state over in the next micro-batch where it can")
          None
        } else if (umjoinState.isEmpty && sparkJoinState.nonEmpty) {
          val takeOver = sparkJoinTakeOver(root, ie, operators)
          takeOver.left.foreach(why => note(s"the joins of this query stay as Spark planned " +
            s"them: a StreamingUMJoin cannot take their state in the checkpoint " +
            s"${ie.checkpointLocation} over: $why"))
          takeOver.toOption.flatMap(format => planGroups(root, ie, firstOfRun, Some(format)))
        } else if (leftToAdaptivePlanning(root)) {
          if (root.exists(_.isInstanceOf[Join])) note(StreamingGroupPlanner.AdaptiveStreamStatic)
          None
        } else planGroups(root, ie, firstOfRun, None)
      }.map(r => Seq(planLater(r))).getOrElse(Nil)
    case _ => Nil
  }

  /**
   * The run's first micro-batch, and the stateful operators the checkpoint's metadata named then
   * (read once per run).
   */
  private def startOf(ie: IncrementalExecution, run: StreamingRun): (Long, Map[Long, String]) = {
    run.started.compareAndSet(null, (ie.currentBatchId,
      OperatorCheckpoint.operatorsIn(ie.checkpointLocation, session.sessionState.newHadoopConf())))
    run.started.get
  }

  /**
   * Refuses a StreamingUMJoin's state kept under an operator whose metadata names Spark's join:
   * an earlier version of UMJoin replaced the joins after Spark had planned them (and written
   * their metadata); Spark's join would read that state as its own.
   */
  private def refuseEarlierUMJoinState(ie: IncrementalExecution, operatorId: Long): Unit = {
    val info = StreamingPlannerStrategy.stateInfoOf(ie, operatorId)
    val checkpoint = new OperatorCheckpoint(info, session.sessionState.newHadoopConf())
    if (checkpoint.hasUMJoinState && !checkpoint.takesOverSparkJoins && !checkpoint.takenBack) {
      throw new IllegalStateException(checkpoint.refusal(
        "a StreamingUMJoin's state written by an earlier version of UMJoin, which replaced " +
          "Spark's joins after Spark had planned them (the checkpoint's metadata names Spark's " +
          "join there); this version plans the joins itself and cannot continue that state. " +
          "Finish the query with the UMJoin version that wrote it, or use a new checkpoint " +
          "location"))
    }
  }

  /**
   * The join state format of Spark's joins whose state a StreamingUMJoin may take over in this
   * micro-batch (the checkpoint's `operators` hold theirs), or why none can: the state must be
   * the joins' only, one operator per stream-stream join of the plan (so their ids are the ones
   * the groups reserve), and on RocksDB (UMJoin's stores start at a later version there only).
   */
  private def sparkJoinTakeOver(root: LogicalPlan, ie: IncrementalExecution,
      operators: Map[Long, String]): Either[String, Int] = {
    val joins = root.collect { case j: Join if isStreamJoin(j) => j }.size
    val sqlConf = ie.sparkSession.sessionState.conf
    if (StoreLayout.forSession(sqlConf) == StoreLayout.Separate) {
      Left("Spark's HDFS-backed state store, which the checkpoint keeps, cannot start " +
        "UMJoin's stores at a later version (RocksDB's can: spark.sql.streaming.stateStore." +
        s"providerClass=${StoreLayout.RocksDBProvider} with a new checkpoint location)")
    } else if (operators.values.exists(_ != SparkJoinName) || operators.size != joins) {
      Left(s"it holds the state of other operators than the plan's $joins stream-stream " +
        s"joins (${operators.toSeq.sorted.map { case (id, name) => s"$id: $name" }
          .mkString(", ")}); UMJoin takes over the state of queries whose only stateful " +
        "operators are their stream-stream joins")
    } else Right(sqlConf.getConf(SQLConf.STREAMING_JOIN_STATE_FORMAT_VERSION))
  }

  private def isStreamJoin(p: LogicalPlan): Boolean = p match {
    case j: Join => j.left.isStreaming && j.right.isStreaming
    case _ => false
  }

  private def isJoinOfAStream(p: LogicalPlan): Boolean = p match {
    case j: Join => j.isStreaming
    case _ => false
  }

  /**
   * Whether the micro-batch is left to Spark, planned adaptively as without UMJoin: Spark plans a
   * micro-batch without stateful operators adaptively (AQE and AQE for stateless streaming, both
   * on by default), and a StreamingUMJoin would make it stateful, so one without a stream-stream
   * join converts only where a group may store a table (a micro-batch is then planned the same
   * with AQE on and off, and a checkpoint continues under either).
   */
  private def leftToAdaptivePlanning(root: LogicalPlan): Boolean = {
    val sqlConf = session.sessionState.conf
    val conf = UMJoinConf.from(sqlConf)
    sqlConf.adaptiveExecutionEnabled && sqlConf.adaptiveExecutionEnabledInStatelessStreaming &&
      !root.exists(isStreamJoin) && !(conf.staticTables != StaticTablesMode.Reread &&
        root.collect { case j: Join => joinedInputs(j) }.exists { inputs =>
          val batchRows = inputs.filter(_.isStreaming).map(StaticStoring.estimatedRows).sum
          inputs.size >= conf.minInputsOf(timeSliced = false) && inputs.exists(_.isStreaming) &&
            inputs.exists(input => StaticVersions.versionable(input) &&
              !canBroadcastBySize(input, sqlConf) && StaticStoring.stores(conf.staticTables,
                Some(StaticStoring.estimatedRows(input)), Some(batchRows)))
        })
  }

  /**
   * The inputs of the join tree under `plan`, through the projections and filters between its
   * joins.
   */
  private def joinedInputs(plan: LogicalPlan): Seq[LogicalPlan] = plan match {
    case j: Join => joinedInputs(j.left) ++ joinedInputs(j.right)
    case p @ (_: Project | _: Filter) if p.children.head.isInstanceOf[Join] =>
      joinedInputs(p.children.head)
    case other => Seq(other)
  }

  /**
   * The micro-batch being planned on this thread: Spark plans a micro-batch on its query's own
   * thread, with the query's id and the batch id set as the thread's local properties.
   */
  private def currentExecution: Option[IncrementalExecution] = {
    val sc = session.sparkContext
    for {
      classic <- Option(session).collect { case c: ClassicSession => c }
      queryId <- Option(sc.getLocalProperty(StreamExecution.QUERY_ID_KEY))
        .flatMap(id => Try(UUID.fromString(id)).toOption)
      batchId <- Option(sc.getLocalProperty(MicroBatchExecution.BATCH_ID_KEY))
        .flatMap(_.toLongOption)
      query <- ActiveQueries.byId(classic, queryId)
      micro <- Option(query).collect { case m: MicroBatchExecution => m }
      context <- Option(micro.getLatestExecutionContext())
      ie <- Option(context.executionPlan)
      if ie.currentBatchId == batchId
    } yield ie
  }

  /**
   * The plan with the groups of each join region (a tree of joins of streams and the projections
   * and filters between them) planned, or None when no group converts.
   */
  private def planGroups(root: LogicalPlan, ie: IncrementalExecution, firstOfRun: Boolean,
      takeOverFormat: Option[Int]): Option[LogicalPlan] = {
    var converted = false
    var reserved = 0
    val staticSlots = Iterator.from(0)
    def visit(l: LogicalPlan): LogicalPlan =
      if (SparkJoinTakeBack.startsRegion(l)) {
        planRegion(l, ie, firstOfRun, staticSlots, takeOverFormat).map { case (r, ids) =>
          converted = true
          reserved += ids
          r
        }.getOrElse(l)
      } else l.mapChildren(visit)
    val rewritten = visit(root)
    // Spark's joins' state is taken over whole or not at all: a join left to Spark would get
    // another operator id than its state's.
    if (converted && takeOverFormat.isDefined && rewritten.exists {
        case j: Join => isStreamJoin(j)
        case _ => false
      }) {
      StreamingPlannerStrategy.giveBack(ie, reserved)
      val run = StreamingRun.of(session, ie.runId)
      val message = "the joins of this query stay as Spark planned them: a StreamingUMJoin " +
        s"takes the state of Spark's joins in the checkpoint ${ie.checkpointLocation} over " +
        "only where it replaces every stream-stream join of the query, and some stay Spark's"
      if (run.firstNote(message)) logInfo(s"UMJoin: $message")
      None
    } else Option.when(converted)(rewritten)
  }

  /**
   * The region's groups planned, or None when none converts. `staticSlots` numbers the joins of a
   * stream with a static table in the micro-batch's plan order.
   */
  private def planRegion(root: LogicalPlan, ie: IncrementalExecution, firstOfRun: Boolean,
      staticSlots: Iterator[Int], takeOverFormat: Option[Int]): Option[(LogicalPlan, Int)] = {
    val now = ie.offsetSeqMetadata.batchWatermarkMs
    val before = ie.prevOffsetSeqMetadata.map(_.batchWatermarkMs).getOrElse(0L)
    val logicalOf = new IdentityHashMap[SparkPlan, LogicalPlan]()
    // Each stand-in with its output watermarks (this batch's, the batch before's), as Spark's
    // simulation gives them.
    def standIn(l: LogicalPlan): (SparkPlan, Option[Long], Option[Long]) = {
      val (node, wNow, wBefore) = l match {
        case static if !static.isStreaming => (PlanLater(static), None, None)
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
        case j @ ExtractEquiJoinKeys(_, _, _, _, _, left, right, _) =>
          // A stream joined with a static table: the join Spark would plan, its static side
          // under the broadcast Spark would put there.
          val (ls, lNow, lBefore) = standIn(left)
          val (rs, rNow, rBefore) = standIn(right)
          def broadcast(side: SparkPlan, logical: LogicalPlan): SparkPlan = {
            val exchange = BroadcastExchangeExec(IdentityBroadcastMode, side)
            logicalOf.put(exchange, logical)
            exchange
          }
          val node = ie.planner.JoinSelection(j).headOption match {
            case Some(b: BroadcastHashJoinExec) if b.buildSide == BuildRight && left.isStreaming =>
              b.withNewChildren(Seq(ls, broadcast(rs, right)))
            case Some(b: BroadcastHashJoinExec) if b.buildSide == BuildLeft && right.isStreaming =>
              b.withNewChildren(Seq(broadcast(ls, left), rs))
            case Some(spark) => spark.withNewChildren(Seq(ls, rs))
            case None => PlanLater(j)
          }
          (node, (lNow ++ rNow).minOption, (lBefore ++ rBefore).minOption)
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
    // One id per stream-stream join, in plan order, taken from the micro-batch's counter (and given
    // back if no group converts: Spark's joins then get the ids they get without UMJoin); one per
    // join of a stream with a static table from StaticGroupIds on.
    val streamJoins = tree.collect { case j: StreamJoinMember => j }
    val staticJoins = tree.collect { case j: BaseJoinExec => j }
    val ids = new IdentityHashMap[SparkPlan, StatefulOperatorStateInfo]()
    streamJoins.foreach(j => ids.put(j, StreamingPlannerStrategy.nextStateInfo(ie)))
    staticJoins.foreach(j => ids.put(j,
      StreamingPlannerStrategy.stateInfoOf(ie, StaticGroupIds + staticSlots.next())))
    val joins = streamJoins ++ staticJoins
    // A group's operator is its first stream-stream join's, else its first join's.
    def operatorOf(members: Seq[SparkPlan]): Option[StatefulOperatorStateInfo] =
      members.collectFirst { case j: StreamJoinMember => ids.get(j) }
        .orElse(members.collectFirst { case j: BaseJoinExec if ids.containsKey(j) => ids.get(j) })
    val marked = root.exists(_.isInstanceOf[EventTimeWatermark])
    val planned = groups.plannedGroups(tree, operatorOf, joins.map(ids.get), firstOfRun,
      ie.runId, Option.when(marked)(now), takeOverFormat)
    if (planned.isEmpty) {
      StreamingPlannerStrategy.giveBack(ie, streamJoins.size)
      None
    }
    else {
      val byRoot = new IdentityHashMap[LogicalPlan, (Seq[SparkPlan] => SparkPlan, Seq[SparkPlan])]()
      planned.foreach { case (groupRoot, inputs, build) =>
        byRoot.put(logicalOf.get(groupRoot), (build, inputs))
      }
      def rewrite(l: LogicalPlan): LogicalPlan = Option(byRoot.get(l)) match {
        case Some((build, inputs)) =>
          PlannedStreamingGroup(build(inputs.map(i => PlanLater(rewrite(logicalOf.get(i))))),
            l.output)
        case None => l.mapChildren(rewrite)
      }
      Some((rewrite(root), streamJoins.size))
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

  /** The state of operator `id` in this micro-batch, as the counter gives it (left as it was). */
  private def stateInfoOf(ie: IncrementalExecution, id: Long): StatefulOperatorStateInfo = {
    val next = nextStateInfo(ie)
    giveBack(ie, 1)
    next.copy(operatorId = id)
  }

  /** Gives the micro-batch's counter back the last `count` ids taken (none taken since). */
  private def giveBack(ie: IncrementalExecution, count: Int): Unit = {
    val field = classOf[IncrementalExecution].getDeclaredField("statefulOperatorId")
    field.setAccessible(true)
    field.get(ie).asInstanceOf[java.util.concurrent.atomic.AtomicInteger].addAndGet(-count)
  }

  /**
   * The first operator id of groups of one stream and static tables: far above the ids Spark
   * gives (from 0, one per stateful operator of the plan).
   */
  val StaticGroupIds: Long = 1000000L

  private val UMJoinName = StreamingUMJoinExec.ShortName
  /** Spark's stream-stream join's `shortName`, as its metadata names it. */
  private val SparkJoinName = "symmetricHashJoin"
}
