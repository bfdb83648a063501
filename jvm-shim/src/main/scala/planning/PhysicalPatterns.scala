package umjoin.spark.planning

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.catalyst.plans.{Inner, JoinType}
import org.apache.spark.sql.execution.{FilterExec, ProjectExec, SparkPlan}
import org.apache.spark.sql.execution.exchange.ShuffleExchangeExec
import org.apache.spark.sql.execution.streaming.operators.stateful.join.StreamingSymmetricHashJoinExec

import umjoin.spark.tsc.{Check, MemberPatterns, NodeKind, PatternVocabulary}

/** What `rules/streaming.yaml` may say about a micro-batch's physical plan. */
object PhysicalPatterns {

  private val supportedJoinTypes: Map[String, JoinType] = Map("Inner" -> Inner)

  val vocabulary: PatternVocabulary[SparkPlan] = PatternVocabulary(
    planType = "physical",
    nodeKinds = Map(
      "StreamingSymmetricHashJoinExec" -> NodeKind[SparkPlan](_.isInstanceOf[StreamingSymmetricHashJoinExec], isJoin = true),
      "ShuffleExchangeExec" -> NodeKind[SparkPlan](_.isInstanceOf[ShuffleExchangeExec], isJoin = false),
      "ProjectExec" -> NodeKind[SparkPlan](_.isInstanceOf[ProjectExec], isJoin = false),
      "FilterExec" -> NodeKind[SparkPlan](_.isInstanceOf[FilterExec], isJoin = false)),
    checks = Map(
      "joinType" -> Check[SparkPlan](Set("StreamingSymmetricHashJoinExec"), "takes a list of join types (supported: Inner)", arg => {
        val names = if (arg.isArray) arg.elements.asScala.map(_.asText).toSeq else Seq.empty
        val unknown = names.filterNot(supportedJoinTypes.contains)
        if (names.isEmpty) Left("expected a non-empty list such as [Inner]")
        else if (unknown.nonEmpty) Left(s"${unknown.mkString(", ")} cannot be a streaming UMJoin member; it computes inner joins")
        else {
          val types = names.map(supportedJoinTypes).toSet
          Right { case j: StreamingSymmetricHashJoinExec => types.contains(j.joinType); case _ => false }
        }
      }),
      "stateful" -> MemberPatterns.flag[SparkPlan](Set("StreamingSymmetricHashJoinExec")) {
        case j: StreamingSymmetricHashJoinExec => j.stateInfo.isDefined
        case _ => false
      },
      "attributesOnly" -> MemberPatterns.flag[SparkPlan](Set("ProjectExec")) {
        case p: ProjectExec => p.projectList.forall(_.isInstanceOf[Attribute])
        case _ => false
      }))
}
