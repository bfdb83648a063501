package umjoin.spark.core.probe

import org.apache.spark.sql.catalyst.expressions.Expression

/**
 * A probe route: the order in which a row of input `start` probes the other inputs' stores, as
 * edges (from, to): `to`'s store is probed by a key it shares with `from`, bound earlier. This is
 * what the probe-order policies and the probe-cost model choose and what a streaming checkpoint
 * records; planned over a join graph ([[ProbeSteps.along]]) it becomes a [[Route.Plan]], its steps
 * and, in a stream, its segments; compiled in a task, a [[CompiledRoute]].
 */
final case class Route(start: Int, edges: Seq[(Int, Int)]) {
  /** The inputs in the order they are bound (dpPick's O[i], paper 001). */
  def order: Seq[Int] = start +: edges.map(_._2)
}

object Route {

  /** How the partial combinations of a route reach the store probed next. */
  sealed trait Reach

  object Reach {
    /**
     * They are in the right partition already (always, in batch: a task holds every store it
     * probes).
     */
    case object Local extends Reach
    /**
     * Shuffled to the one partition their value of `keyClass` (the store's partitioning class)
     * hashes to.
     */
    final case class ByKey(keyClass: Int) extends Reach
    /**
     * Sent to every partition: they do not carry the store's partitioning class yet (CLASH's chi).
     */
    case object AllPartitions extends Reach
  }

  /**
   * One step: `input`'s store is probed through `index` with `probeKeys` (its classes' values, from
   * inputs bound earlier), reached as `reach` says; `conditions` are checked once the stored row is
   * bound. `from` is the route's edge source, which the statistics are kept for. `rule` says what a
   * match and its absence do ([[StepRule]]). For an outer step, `conditions` are its ON clause's,
   * which decide what matches, and `postConditions` the others that become complete with this
   * input, checked on the bound row, NULL-padded or not. `firstMatchDecides`: the post conditions
   * fail for every matching row (a left anti join of two streams, run as a left outer join keeping
   * the padded rows), so the probe stops at the first match.
   */
  final case class Step(input: Int, from: Int, index: StoreIndex, probeKeys: Seq[Expression],
      conditions: Seq[Expression], rule: StepRule = StepRule.InnerStep,
      postConditions: Seq[Expression] = Nil, reach: Reach = Reach.Local,
      firstMatchDecides: Boolean = false)

  /**
   * Steps [from, until) of a route, run in one task; then the combinations move by `next` (None:
   * they are complete rows).
   */
  final case class Segment(from: Int, until: Int, next: Option[Reach])

  /**
   * A route planned over a join graph: the conditions on the start row alone, then one step per
   * other input.
   */
  final case class Plan(route: Route, startConditions: Seq[Expression], steps: Seq[Step]) {
    def start: Int = route.start

    /**
     * The steps cut where the combinations move to other partitions (one segment in batch); a
     * stream's tasks read them per row.
     */
    lazy val segments: IndexedSeq[Segment] = {
      // A route whose first step leaves the partition starts with an empty segment: the row is
      // shipped as it is.
      val bounds = 0 +: steps.indices.filter(t => steps(t).reach != Reach.Local) :+ steps.size
      bounds.zip(bounds.tail).map { case (from, until) => Segment(from, until,
        if (until < steps.size) Some(steps(until).reach) else None) }.toIndexedSeq
    }
  }
}
