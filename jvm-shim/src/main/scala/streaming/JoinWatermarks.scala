package umjoin.spark.streaming

import org.apache.spark.sql.catalyst.plans.logical.EventTimeWatermark
import org.apache.spark.sql.execution.{PlanLater, SparkPlan}
import org.apache.spark.sql.execution.streaming.operators.stateful.{EventTimeWatermarkExec,
  StateStoreWriter}

import umjoin.spark.core.tsc.{MultiJoinGroup, StreamJoin}

/**
 * The watermark a StreamingUMJoin passes on to the operators after it: the one Spark's join tree
 * would pass on. Spark computes every stateful operator's watermarks by simulating their
 * propagation over a plan: a watermark node puts out the global watermark W, a stateful operator
 * takes the least of its children's and puts out what it says (a join: the lower of its state
 * watermarks). Over a join tree, what the top join puts out is W less an offset the query fixes
 * (its time ranges); the StreamingUMJoin takes W from its inputs and puts out W less that offset.
 */
object JoinWatermarks {

  /** A global watermark far above any offset: the offsets are what the simulation takes off it. */
  private val Far = 4000000000000L

  /**
   * What the group's output watermark is less its input watermark, as Spark's simulation over its
   * stream-stream joins (`joins`) gives it (0 where they have no watermark), or why Spark's
   * watermarks cannot be reproduced for the group.
   */
  def outputShiftMs(group: MultiJoinGroup[SparkPlan],
      joins: Seq[StreamJoin]): Either[String, Long] = {
    val reached = new java.util.IdentityHashMap[SparkPlan, Option[Long]]()
    // Spark's simulation, over the group's stand-ins (an input's own stateful operators included).
    def simulate(node: SparkPlan): Option[Long] = node match {
      case _: EventTimeWatermarkExec => Some(Far)
      case later: PlanLater =>
        Option.when(later.plan.exists(_.isInstanceOf[EventTimeWatermark]))(Far)
      case _ =>
        val in = node.children.flatMap(simulate).minOption
        node match {
          case StreamJoin(j) if joins.exists(_.node eq j.node) =>
            reached.put(j.node, in)
            in.flatMap(j.produceOutputWatermark)
          case s: StateStoreWriter => in.flatMap(s.produceOutputWatermark)
          case _ => in
        }
    }
    val output = simulate(group.root)
    val inputs = joins.map(j => reached.get(j.node))
    if (inputs.forall(_.isEmpty)) Right(0L)
    else if (inputs.exists(_.isEmpty) || output.isEmpty)
      Left("some of its stream-stream joins have no watermark below them and others do, which " +
        "the StreamingUMJoin cannot pass on as Spark does")
    else Right(output.get - Far)
  }
}
