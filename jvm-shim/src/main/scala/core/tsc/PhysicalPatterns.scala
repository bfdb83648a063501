package umjoin.spark.core.tsc

import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.catalyst.plans.{Inner, JoinType, LeftOuter, LeftSemi, RightOuter}
import org.apache.spark.sql.execution.{FilterExec, PlanLater, ProjectExec, SortExec, SparkPlan}
import org.apache.spark.sql.execution.exchange.{BroadcastExchangeExec, ShuffleExchangeExec}
import org.apache.spark.sql.execution.joins.{BaseJoinExec, BroadcastHashJoinExec,
  ShuffledHashJoinExec, SortMergeJoinExec}
import org.apache.spark.sql.execution.streaming.operators.stateful.join.{
  StreamingSymmetricHashJoinExec}

/** What `rules/streaming.yaml` may say about a micro-batch's physical plan. */
object PhysicalPatterns {

  /**
   * Join types a streaming UMJoin computes: inner joins, and an outer or semi stream-stream join on
   * top of its group.
   */
  private val supportedJoinTypes: Map[String, JoinType] =
    Map("Inner" -> Inner, "LeftOuter" -> LeftOuter, "RightOuter" -> RightOuter,
      "LeftSemi" -> LeftSemi)

  /**
   * The non-preserved side of an outer or semi stream-stream join is one input of the group: the
   * stream matched against.
   */
  def keptAsInput(output: SparkPlan, child: SparkPlan): Boolean = output match {
    case StreamJoin(j) if j.joinType == LeftOuter || j.joinType == LeftSemi => j.right eq child
    case StreamJoin(j) if j.joinType == RightOuter => j.left eq child
    case _ => false
  }

  private val streamStaticJoins =
    Set("BroadcastHashJoinExec", "ShuffledHashJoinExec", "SortMergeJoinExec")

  /**
   * Whether a micro-batch plan reads a stream: Spark keeps the streaming flag on the logical plans
   * it planned from.
   */
  def isStreaming(plan: SparkPlan): Boolean = plan match {
    case later: PlanLater => later.plan.isStreaming
    case _ => plan.logicalLink.map(_.isStreaming).getOrElse(plan.children.exists(isStreaming))
  }

  private def joinTypeOf(plan: SparkPlan): Option[JoinType] = plan match {
    case StreamJoin(j) => Some(j.joinType)
    case j: BaseJoinExec => Some(j.joinType)
    case _ => None
  }

  val vocabulary: PatternVocabulary[SparkPlan] = PatternVocabulary(
    planType = "physical",
    nodeKinds = Map(
      "StreamingSymmetricHashJoinExec" ->
        NodeKind[SparkPlan](StreamJoin.unapply(_).isDefined, isJoin = true),
      "BroadcastHashJoinExec" -> NodeKind[SparkPlan](_.isInstanceOf[BroadcastHashJoinExec],
        isJoin = true),
      "ShuffledHashJoinExec" -> NodeKind[SparkPlan](_.isInstanceOf[ShuffledHashJoinExec],
        isJoin = true),
      "SortMergeJoinExec" -> NodeKind[SparkPlan](_.isInstanceOf[SortMergeJoinExec], isJoin = true),
      "ShuffleExchangeExec" -> NodeKind[SparkPlan](_.isInstanceOf[ShuffleExchangeExec],
        isJoin = false),
      "BroadcastExchangeExec" -> NodeKind[SparkPlan](_.isInstanceOf[BroadcastExchangeExec],
        isJoin = false),
      "SortExec" -> NodeKind[SparkPlan](_.isInstanceOf[SortExec], isJoin = false),
      "ProjectExec" -> NodeKind[SparkPlan](_.isInstanceOf[ProjectExec], isJoin = false),
      "FilterExec" -> NodeKind[SparkPlan](_.isInstanceOf[FilterExec], isJoin = false)),
    checks = Map(
      "joinType" -> MemberPatterns.joinTypes[SparkPlan](streamStaticJoins +
        "StreamingSymmetricHashJoinExec", supportedJoinTypes,
        "cannot be a streaming UMJoin member; it computes inner joins and one left outer, right " +
        "outer or left semi stream-stream join on top of a group")(joinTypeOf),
      "stateful" -> MemberPatterns.flag[SparkPlan](Set("StreamingSymmetricHashJoinExec"),
        "Spark has not given it state") {
          case j: StreamingSymmetricHashJoinExec => j.stateInfo.isDefined
          case _: StreamJoinMember => true
          case _ => false
        },
      "streamStatic" -> MemberPatterns.flag[SparkPlan](streamStaticJoins,
        "it does not join one stream with a static table") { join =>
          join.children.count(isStreaming) == 1
        },
      "attributesOnly" -> MemberPatterns.flag[SparkPlan](Set("ProjectExec"),
        "it computes columns") {
          case p: ProjectExec => p.projectList.forall(_.isInstanceOf[Attribute])
          case _ => false
        },
      "deterministic" -> MemberPatterns.flag[SparkPlan](Set("ProjectExec"),
        "it computes something non-deterministic") {
          case p: ProjectExec => p.projectList.forall(_.deterministic)
          case _ => false
        }))
}
