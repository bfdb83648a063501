package umjoin.spark.core.probe

import org.apache.spark.sql.catalyst.plans.{Inner, JoinType, LeftAnti, LeftOuter, LeftSemi}

/**
 * What a probe step does with the stored rows matching a combination, per join type: the one
 * description the interpreted loop ([[ProbeCore]]), the generated code (batch `UMJoinCodegen`) and
 * a stream's waiting combinations (`StageTask`) all follow.
 *
 * | join type | binds a matching row | stops at the first match | with a match   | with none      |
 * |-----------|----------------------|--------------------------|----------------|----------------|
 * | inner     | yes, each in turn    | no                       | goes on        | ends           |
 * | left semi | no                   | yes                      | goes on once   | ends (waits)   |
 * | left anti | no                   | yes                      | ends           | goes on once   |
 * | left outer| yes, each in turn    | no                       | goes on        | goes on padded
 * (waits) |
 *
 * "Waits": in a stream, a later row of the input may still match, so the combination is kept
 * unmatched until one does or the watermark rules it out.
 */
sealed abstract class StepRule(val joinType: JoinType) {
  /**
   * Each matching stored row joins the combination (its columns are bound); else the step only
   * filters.
   */
  val binds: Boolean
  /** The step is done at its first matching row: the combination goes on at most once. */
  val firstMatchOnly: Boolean
  /** The combination goes on where a stored row matched it. */
  val goesOnMatched: Boolean
  /**
   * Where no stored row matched: the combination ends, goes on as it is, or goes on with NULLs for
   * the input's columns.
   */
  val noMatch: StepRule.NoMatch

  /** A store without rows ends every combination, so nothing needs to be read. */
  def emptyStoreEndsAll: Boolean = noMatch == StepRule.Ends
  /**
   * How `explain()` marks the input in a probe order: "" for inner, " (semi)", " (anti)", "
   * (outer)".
   */
  def label: String = if (this == StepRule.InnerStep) "" else s" ($name)"
  def name: String
}

object StepRule {
  sealed trait NoMatch
  case object Ends extends NoMatch
  case object GoesOnAsIs extends NoMatch
  case object Padded extends NoMatch

  case object InnerStep extends StepRule(Inner) {
    val binds = true; val firstMatchOnly =
      false; val goesOnMatched = true; val noMatch: NoMatch = Ends; val name = "inner"
  }
  case object Semi extends StepRule(LeftSemi) {
    val binds = false; val firstMatchOnly =
      true; val goesOnMatched = true; val noMatch: NoMatch = Ends; val name = "semi"
  }
  case object Anti extends StepRule(LeftAnti) {
    val binds = false; val firstMatchOnly =
      true; val goesOnMatched = false; val noMatch: NoMatch = GoesOnAsIs; val name = "anti"
  }
  case object Outer extends StepRule(LeftOuter) {
    val binds = true; val firstMatchOnly =
      false; val goesOnMatched = true; val noMatch: NoMatch = Padded; val name = "outer"
  }

  def of(joinType: JoinType): StepRule = joinType match {
    case Inner => InnerStep
    case LeftSemi => Semi
    case LeftAnti => Anti
    case LeftOuter => Outer
    case other => throw new IllegalArgumentException(
      s"a probe step is an inner, left semi, left anti or left outer join, not $other")
  }
}
