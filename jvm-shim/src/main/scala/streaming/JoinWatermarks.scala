package umjoin.spark.streaming

import org.apache.spark.sql.catalyst.plans.logical.EventTimeWatermark
import org.apache.spark.sql.execution.{PlanLater, SparkPlan}
import org.apache.spark.sql.execution.streaming.operators.stateful.{EventTimeWatermarkExec,
  StateStoreWriter}
import org.apache.spark.sql.execution.streaming.operators.stateful.join.{
  StreamingSymmetricHashJoinExec}

import umjoin.spark.core.tsc.{MultiJoinGroup, PhysicalPatterns, StreamJoin}

/**
 * Where the ids of the stream-stream joins a StreamingUMJoin replaces sit in its plan, so that
 * Spark gives each of them (and every stateful operator after the group) the watermark it gives it
 * in its own join tree.
 *
 * Spark computes every stateful operator's watermarks by simulating their propagation over a plan:
 * a watermark node puts out the global watermark W, a stateful operator takes the least of its
 * children's and puts out what it says (a join: the lower of its state watermarks), and each
 * operator id gets what reached it. It simulates over the micro-batch's plan before the joins are
 * replaced, but also over the previous micro-batch's executed plan, where they are. Over a join
 * tree every input watermark is W less an offset the query fixes (its time ranges). So the
 * StreamingUMJoin's one input `carrier`, the one that puts out the input watermark of the join of
 * least offset, goes through the replaced joins' ids in `chain`, in the order of their offsets,
 * each passing on W less the next one's offset (`shiftMs`); the StreamingUMJoin, the top join's
 * id, gets W less its offset from the chain (no input puts out less: watermarks only fall going
 * up a join tree), and passes on W less the group's output offset (`outputShiftMs`).
 */
final case class JoinWatermarks(carrier: Int, chain: Seq[(StreamingSymmetricHashJoinExec, Long)],
    outputShiftMs: Long)

object JoinWatermarks {

  /** A global watermark far above any offset: the offsets are what the simulation takes off it. */
  private val Far = 4000000000000L

  /**
   * The chain for the group's stream-stream joins (`joins`, the top one first, whose id the
   * StreamingUMJoin keeps), None when they have no watermark, or why Spark's watermarks cannot be
   * reproduced for the group. Joins Spark never planned (the streaming planner's, without state
   * info) have no ids to keep: the StreamingUMJoin takes its inputs' watermark and shifts it
   * (`outputShiftMs`) to the group's output.
   */
  def of(group: MultiJoinGroup[SparkPlan],
      joins: Seq[StreamJoin]): Either[String, Option[JoinWatermarks]] = {
    val inputWatermark = new java.util.IdentityHashMap[SparkPlan, Option[Long]]()
    // Spark's simulation, over the group as Spark planned it (an input's own stateful operators
    // included).
    def simulate(node: SparkPlan): Option[Long] = node match {
      case _: EventTimeWatermarkExec => Some(Far)
      case later: PlanLater =>
        Option.when(later.plan.exists(_.isInstanceOf[EventTimeWatermark]))(Far)
      case _ =>
        val in = node.children.flatMap(simulate).minOption
        node match {
          case StreamJoin(j) if joins.exists(_.node eq j.node) =>
            inputWatermark.put(j.node, in)
            in.flatMap(j.produceOutputWatermark)
          case s: StateStoreWriter => in.flatMap(s.produceOutputWatermark)
          case _ => in
        }
    }
    val output = simulate(group.root)
    val offsets = joins.map(j => j -> inputWatermark.get(j.node).map(Far - _))
    if (joins.isEmpty || offsets.forall(_._2.isEmpty)) Right(None)
    else if (offsets.exists(_._2.isEmpty) || output.isEmpty)
      Left("some of its stream-stream joins have no watermark below them and others do, which " +
        "the StreamingUMJoin cannot pass on as Spark does")
    else if (joins.forall(_.stateInfo.isEmpty))
      Right(Some(JoinWatermarks(-1, Nil, output.get - Far)))
    else {
      val top = offsets.head._2.get
      val below = offsets.tail.map { case (j, c) => (j, c.get) }.sortBy(_._2)
      // The chain starts from the carrier's output watermark: the first join's input watermark.
      // Spark's join of least offset takes it from one of its inputs, so some input puts it out.
      val first = below.headOption.map(_._2).getOrElse(top)
      val carrier = group.inputs.indexWhere(input => PhysicalPatterns.isStreaming(input) &&
        simulate(input).contains(Far - first))
      if (carrier < 0) Left("no input of the group puts out the watermark its lowest " +
        "stream-stream join takes, which the StreamingUMJoin cannot pass on as Spark does")
      else {
        val next = below.drop(1).map(_._2) :+ top
        val chain = below.zip(next).map { case ((j, c), n) =>
          (j.node.asInstanceOf[StreamingSymmetricHashJoinExec], c - n)
        }
        Right(Some(JoinWatermarks(carrier, chain, top - (Far - output.get))))
      }
    }
  }
}
