package umjoin.spark.core.probe

import org.apache.spark.sql.catalyst.expressions.{And, Attribute, BinaryComparison, BoundReference,
  Cast, Coalesce, Expression, Greatest, In, InSet, IsNotNull, IsNull, Least, Literal, Not, Or,
  TimestampAddInterval}

/**
 * The order a step checks its conditions in: those that cannot fail first (comparisons of columns
 * and constants, time ranges, bands), then the others in the order the query wrote them. So an
 * expensive condition (a UDF, a similarity) is evaluated only for the rows the simple ones leave,
 * whatever the order it was written in (PSP paper 004: cheap predicates before the expensive one).
 * Only conditions that cannot fail move ahead: one that can (an ANSI overflow, a cast of a string)
 * would then be evaluated on rows the written order kept from it, and fail where the query does
 * not.
 */
object ConditionOrder {

  def cheapFirst(conditions: Seq[Expression]): Seq[Expression] = {
    val (simple, others) = conditions.partition(cannotFail)
    simple ++ others
  }

  /** Whether `e` cannot raise an error on any row, and costs about a comparison. */
  def cannotFail(e: Expression): Boolean = e match {
    case _: Attribute | _: BoundReference | _: Literal => true
    case _: BinaryComparison | _: And | _: Or | _: Not | _: IsNull | _: IsNotNull | _: Least |
      _: Greatest | _: Coalesce |
         _: In | _: InSet => e.children.forall(cannotFail)
    case c: Cast => Cast.canUpCast(c.child.dataType, c.dataType) && cannotFail(c.child)
    // A timestamp moved by a constant interval: it overflows only past the year 294,247.
    case t: TimestampAddInterval => t.interval.foldable && cannotFail(t.start)
    case _ => false
  }
}
