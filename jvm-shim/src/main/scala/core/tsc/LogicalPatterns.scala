package umjoin.spark.core.tsc

import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.catalyst.planning.ExtractEquiJoinKeys
import org.apache.spark.sql.catalyst.plans.{Cross, Inner, JoinType, LeftAnti, LeftOuter,
  LeftSemi, RightOuter}
import org.apache.spark.sql.catalyst.plans.logical.{BROADCAST, Filter, HintInfo, Join,
  JoinStrategyHint, LogicalPlan, Project, SHUFFLE_HASH, SHUFFLE_MERGE, SHUFFLE_REPLICATE_NL}

/** What `rules/batch.yaml` may say about Spark's optimized logical plans. */
object LogicalPatterns {

  /** Join types UMJoin computes; full outer joins stay as Spark plans them. */
  private val supportedJoinTypes: Map[String, JoinType] =
    Map("Inner" -> Inner, "Cross" -> Cross, "LeftSemi" -> LeftSemi,
      "LeftAnti" -> LeftAnti, "LeftOuter" -> LeftOuter, "RightOuter" -> RightOuter)

  /**
   * The non-preserved side of a semi, anti or outer join is one input of the group: the store the
   * join probes.
   */
  def keptAsInput(output: LogicalPlan, child: LogicalPlan): Boolean = output match {
    case j: Join if j.joinType == LeftSemi || j.joinType == LeftAnti || j.joinType == LeftOuter =>
      j.right eq child
    case j: Join if j.joinType == RightOuter => j.left eq child
    case _ => false
  }

  /**
   * Strategy hints a user can write; Spark's own adaptive hints (e.g. NO_BROADCAST_HASH) do not
   * count.
   */
  private val userStrategyHints: Set[JoinStrategyHint] =
    Set(BROADCAST, SHUFFLE_MERGE, SHUFFLE_HASH, SHUFFLE_REPLICATE_NL)

  private def hasUserHint(info: Option[HintInfo]): Boolean =
    info.exists(_.strategy.exists(userStrategyHints.contains))

  val vocabulary: PatternVocabulary[LogicalPlan] = PatternVocabulary(
    planType = "logical",
    nodeKinds = Map(
      "Join" -> NodeKind[LogicalPlan](_.isInstanceOf[Join], isJoin = true),
      "Project" -> NodeKind[LogicalPlan](_.isInstanceOf[Project], isJoin = false),
      "Filter" -> NodeKind[LogicalPlan](_.isInstanceOf[Filter], isJoin = false)),
    checks = Map(
      "joinType" -> MemberPatterns.joinTypes[LogicalPlan](Set("Join"), supportedJoinTypes,
        "cannot be a UMJoin member; UMJoin computes inner, left semi, left anti, left outer " +
          "and right outer joins (full outer joins stay as Spark plans them and may be inputs of " +
          "a group)") {
        case j: Join => Some(j.joinType)
        case _ => None
      },
      "equiJoinKey" -> MemberPatterns.flag[LogicalPlan](Set("Join"),
        "it has no equality between its two sides: UMJoin finds matches by key") {
          case ExtractEquiJoinKeys(_, leftKeys, _, _, _, _, _, _) => leftKeys.nonEmpty
          case _ => false
        },
      "noUserJoinHint" -> MemberPatterns.flag[LogicalPlan](Set("Join"),
        "it carries a join strategy hint, which Spark follows") {
          case j: Join => !hasUserHint(j.hint.leftHint) && !hasUserHint(j.hint.rightHint)
          case _ => false
        },
      "attributesOnly" -> MemberPatterns.flag[LogicalPlan](Set("Project"), "it computes columns") {
        case p: Project => p.projectList.forall(_.isInstanceOf[Attribute])
        case _ => false
      }))
}
