package umjoin.spark.batch

import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.expressions.{Expression, IsNotNull, PredicateHelper}
import org.apache.spark.sql.catalyst.optimizer.JoinSelectionHelper
import org.apache.spark.sql.catalyst.plans.{Cross, Inner, LeftAnti, LeftOuter, LeftSemi, RightOuter}
import org.apache.spark.sql.catalyst.plans.logical.{Filter, Join, LogicalPlan}
import org.apache.spark.sql.catalyst.plans.physical.BroadcastDistribution
import org.apache.spark.sql.execution.{SparkPlan, SparkStrategy}
import org.apache.spark.sql.execution.adaptive.{BroadcastQueryStageExec, LogicalQueryStage}
import org.apache.spark.sql.catalyst.trees.TreeNodeTag
import org.apache.spark.sql.execution.adaptive.AdaptiveSparkPlanHelper
import org.apache.spark.sql.execution.joins.{BaseJoinExec, BroadcastHashJoinExec,
  BroadcastNestedLoopJoinExec}

import umjoin.spark.UMJoinConf
import umjoin.spark.core.{Cut, FilterJoin, GroupSplitting, JoinGraph, OuterJoin}
import umjoin.spark.core.cost.ProbeOrderSettings
import umjoin.spark.core.tsc.{LogicalPatterns, MemberPatterns, MultiJoinGroup, TwoStepConvert}

/**
 * The batch hook: a planner strategy over Spark's fully optimized logical plan (after join
 * reordering). When the node being planned is the root of a TSC group that can run as one
 * operator, it becomes a UMJoinExec whose inputs are planned later; planning those inputs reaches
 * nested groups in turn, so Spark's planner performs TSC step 2's recursive replacement. Under AQE
 * the re-optimized plan is planned by this same strategy.
 */
final class BatchUMJoinStrategy(session: SparkSession, patterns: MemberPatterns[LogicalPlan])
  extends SparkStrategy with JoinSelectionHelper with PredicateHelper with Logging {

  private val tsc = new TwoStepConvert[LogicalPlan](patterns.roleOf, LogicalPatterns.keptAsInput)

  override def apply(plan: LogicalPlan): Seq[SparkPlan] = {
    val conf = UMJoinConf.from(session.sessionState.conf)
    plan match {
      // Streaming joins keep state: Spark's StreamingJoinStrategy (or the streaming hook) plans
      // them.
      case join: Join if conf.enabled && !join.isStreaming && !conf.convertBroadcastJoins &&
          groupBroadcastBySpark(join, conf) =>
        explainRefusal(join, Some(BatchUMJoinStrategy.BroadcastBySpark))
        Nil
      case join: Join if conf.enabled && !join.isStreaming =>
        new GroupSplitting[LogicalPlan, UMJoinPlan](tsc,
          patterns.roleOf, _ => conf.minInputsOf(timeSliced = false), tryPlan, probesBeforeShuffle)
          .groupAt(join) match {
            case Right((group, umjoin)) => Seq(exec(group, umjoin, conf.probeOrder))
            case Left(reason) =>
              explainRefusal(join,
                if (reason == GroupSplitting.NotAGroupRoot) patterns.whyNot(join) else Some(reason))
              Nil
          }
      case _ => Nil
    }
  }

  /**
   * Whether `join` roots a group large enough to convert in which Spark's own join selection
   * (sizes against the broadcast threshold, hints) picks a broadcast join for every join. Such a
   * group stays Spark's: no intermediate result is shuffled and the probes run in Spark's
   * generated code, so a UMJoin saves nothing. Its joins below, planned next, are groups of the
   * same kind. Decided when the query is first planned, and kept by AQE's re-plans (their copies
   * of the join carry the tag): their stages ran for that plan, and Spark's joins could not take
   * an input a UMJoin already broadcast as their streamed side (AQE would drop the re-plan).
   */
  private def groupBroadcastBySpark(join: Join, conf: UMJoinConf): Boolean =
    join.getTagValue(BatchUMJoinStrategy.BroadcastBySparkTag).getOrElse {
      val decided = sparkBroadcastsEveryJoin(join, conf)
      join.setTagValue(BatchUMJoinStrategy.BroadcastBySparkTag, decided)
      decided
    }

  private def sparkBroadcastsEveryJoin(join: Join, conf: UMJoinConf): Boolean =
    tsc.createMultiJoinGroups(join, Nil).find(_.root eq join).exists { group =>
      val planner = session.sessionState.planner
      group.inputs.size >= conf.minInputsOf(timeSliced = false) &&
        group.members.collect { case member: Join => member }.forall { member =>
          planner.JoinSelection(member).headOption.exists {
            case _: BroadcastHashJoinExec | _: BroadcastNestedLoopJoinExec => true
            case _ => false
          }
        }
    }

  /**
   * Says once per query why a join stays as Spark plans it: at INFO, and as a tag on the logical
   * join that `umjoin.plans.why_not` and `explain("extended")` read
   * ([[BatchUMJoinStrategy.whyNot]]). A join that is a member of a group rooted above it has no
   * reason of its own (None).
   */
  private def explainRefusal(join: Join, reason: Option[String]): Unit = reason.foreach { why =>
    // AQE re-plans copies of the same logical joins, which carry the tag: said once.
    if (join.getTagValue(BatchUMJoinStrategy.WhyNotTag).isEmpty) {
      join.setTagValue(BatchUMJoinStrategy.WhyNotTag, why)
      logInfo(s"UMJoin: ${BatchUMJoinStrategy.describe(join)} stays as Spark plans it: $why")
    }
  }

  /** The plan this group runs with, or why it cannot run as one UMJoin. */
  private def tryPlan(group: MultiJoinGroup[LogicalPlan]): Either[String, UMJoinPlan] = {
    val inputs = group.inputs
    def conditionOf(j: Join): Seq[Expression] =
      j.condition.toSeq.flatMap(splitConjunctivePredicates)
    // A semi, anti or outer join's non-preserved side stays one input of the group (TSC keeps it
    // out): the input a semi or anti join filters by, or an outer join pads with NULLs where
    // nothing matches.
    val filterJoins = group.members.collect {
      case j: Join if j.joinType == LeftSemi || j.joinType == LeftAnti =>
        FilterJoin(inputs.indexWhere(_ eq j.right), j.joinType, conditionOf(j))
    }
    val outerJoins = group.members.collect {
      case j: Join if j.joinType == LeftOuter =>
        OuterJoin(inputs.indexWhere(_ eq j.right), conditionOf(j))
      case j: Join if j.joinType == RightOuter =>
        OuterJoin(inputs.indexWhere(_ eq j.left), conditionOf(j))
    }
    val conjuncts = group.members.flatMap {
      case j: Join if j.joinType == Inner || j.joinType == Cross => conditionOf(j)
      case f: Filter => splitConjunctivePredicates(f.condition)
      case _ => Nil
    }
    val sqlConf = session.sessionState.conf
    for {
      graph <- JoinGraph.build(inputs.map(_.output), conjuncts, group.root.output,
        filterJoins, outerJoins)
      facts = inputs.map(i =>
        InputFacts(sizeForStreaming(i), canBroadcastBySize(i, sqlConf), isBroadcastStage(i)))
      plans <- UMJoinPlan.candidates(graph, facts, UMJoinConf.from(sqlConf).probeOrder.adaptive)
      plan <- plans.find(keepsExistingBroadcasts(inputs, _))
        .toRight("an input broadcast earlier in this query was broadcast for a join Spark " +
          "plans itself")
    } yield plan
  }

  /**
   * Probes that reduce a shuffle happen before it. When the group is co-partitioned and Spark's
   * join tree joins one shuffled input with broadcast inputs only in a subtree, one of them
   * filtered (a selective probe: TPC-H's `part` by type or name), the group is cut above the
   * largest such subtree: those joins then run before the exchange, as in Spark's own plan, and
   * only their smaller result is shuffled. Unfiltered broadcast inputs usually multiply rows, so
   * with them the whole group stays one UMJoin and its inputs are shuffled as they are.
   */
  private def probesBeforeShuffle(group: MultiJoinGroup[LogicalPlan], plan: UMJoinPlan,
      cuts: Seq[Cut[LogicalPlan]]): Option[Cut[LogicalPlan]] = {
    def shuffled(i: Int): Boolean = plan.placements(i).isInstanceOf[InputPlacement.HashPartitioned]
    def broadcast(i: Int): Boolean = plan.placements(i) == InputPlacement.Broadcast
    def beforeShuffle(cut: Cut[LogicalPlan]): Boolean =
      cut.inputsBelow.count(shuffled) == 1 &&
        cut.inputsBelow.forall(i => shuffled(i) || broadcast(i)) &&
        cut.inputsBelow.exists(i => broadcast(i) && isFiltered(group.inputs(i)))
    if (group.inputs.indices.exists(shuffled))
      cuts.filter(beforeShuffle).maxByOption(_.inputsBelow.size) else None
  }

  /**
   * An input's size as the choice of the streamed input needs it: Spark's estimate, except that a
   * join below is taken to be no larger than its larger side. Without cost-based statistics Spark
   * estimates an inner join as the product of its sides, which would stream a filtered customer
   * and orders (TPC-H Q5) and store all of lineitem; the joins inputs are made of are mostly on
   * keys.
   */
  private def sizeForStreaming(input: LogicalPlan): BigInt = input match {
    case j: Join => sizeForStreaming(j.left).max(sizeForStreaming(j.right)).min(j.stats.sizeInBytes)
    case p if p.children.size == 1 && p.exists(_.isInstanceOf[Join]) =>
      sizeForStreaming(p.children.head).min(p.stats.sizeInBytes)
    case p => p.stats.sizeInBytes
  }

  /**
   * Whether the input keeps only some of its rows: a filter beyond `IS NOT NULL` (which Spark adds
   * for join keys).
   */
  private def isFiltered(input: LogicalPlan): Boolean = input.exists {
    case Filter(condition, _) =>
      splitConjunctivePredicates(condition).exists(!_.isInstanceOf[IsNotNull])
    case stage: LogicalQueryStage => isFiltered(stage.logicalPlan)
    case _ => false
  }

  private def isBroadcastStage(plan: LogicalPlan): Boolean = plan match {
    case LogicalQueryStage(_, _: BroadcastQueryStageExec) => true
    case _ => false
  }

  /**
   * Under AQE, an input that is already a broadcast stage was broadcast for an earlier plan; the
   * plan must read it the way it was broadcast: as a hash table on the same key (Spark's or a
   * UMJoin's), or as rows.
   */
  private def keepsExistingBroadcasts(inputs: Seq[LogicalPlan], plan: UMJoinPlan): Boolean =
    inputs.indices.forall { i =>
      inputs(i) match {
        case LogicalQueryStage(_, stage: BroadcastQueryStageExec) =>
          plan.placements(i) == InputPlacement.Broadcast && stage.outputPartitioning.satisfies(
            BroadcastDistribution(UMJoinExec.broadcastMode(plan.graph, plan.indexes(i), i,
              stage.output)))
        case _ => true
      }
    }

  private def exec(group: MultiJoinGroup[LogicalPlan], plan: UMJoinPlan,
      probeOrder: ProbeOrderSettings): UMJoinExec = {
    val (graphShape, graphExpressions) = plan.graph.split
    UMJoinExec(
      output = group.root.output,
      inputLabels = group.inputs.map(InputLabels.of),
      graphShape = graphShape,
      graphExpressions = graphExpressions,
      indexes = plan.indexes,
      route = plan.route,
      probeOrder = probeOrder,
      broadcast = plan.placements.map(_ == InputPlacement.Broadcast),
      partitionKeys = plan.placements.map {
        case InputPlacement.HashPartitioned(key) => Some(key)
        case _ => None
      },
      children = group.inputs.map(planLater))
  }
}

object BatchUMJoinStrategy {
  /** Why a logical join stays as Spark plans it, once the strategy has planned it. */
  val WhyNotTag: TreeNodeTag[String] = TreeNodeTag[String]("umjoin.whyNot")

  /** Whether a group stays Spark's as broadcast in every join: decided once per query. */
  val BroadcastBySparkTag: TreeNodeTag[Boolean] = TreeNodeTag[Boolean]("umjoin.broadcastBySpark")

  val BroadcastBySpark: String = "Spark plans every join of its group as a broadcast join, " +
    "shuffling no intermediate result: a UMJoin would save nothing " +
    "(spark.umjoin.convertBroadcastJoins=true converts it anyway)"

  /** A join as people name it: its type, the tables on each side, and its condition. */
  def describe(join: Join): String =
    s"the ${join.joinType.sql}" +
      s" join of ${InputLabels.of(join.left)} and ${InputLabels.of(join.right)}" +
      join.condition.map(c => s" on ${c.sql}").getOrElse(" without a condition")

  /**
   * Every join of a physical plan that stays as Spark planned it, with why: (the join as
   * `explain()` names it, the join as people name it, the reason), in plan order, through AQE's
   * stages. The reason is on the logical join the physical one was planned from (Spark plans a
   * copy of the optimized plan, so the physical plan is the way to it).
   */
  def whyNot(plan: SparkPlan): Seq[(String, String, String)] = {
    val helper = new AdaptiveSparkPlanHelper {}
    helper.collect(plan) { case join: BaseJoinExec => join }.flatMap { join =>
      join.logicalLink.collect { case logical: Join => logical }.flatMap { logical =>
        logical.getTagValue(WhyNotTag).map(reason => (join.nodeName, describe(logical), reason))
      }
    }.distinct
  }
}
