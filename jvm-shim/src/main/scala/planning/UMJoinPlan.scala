package umjoin.spark.planning

import org.apache.spark.sql.catalyst.expressions.{EqualTo, Expression}
import org.apache.spark.sql.types.{ByteType, DataType, IntegerType, LongType, ShortType}

import umjoin.spark.order.ProbeOrder

/** How an input's rows reach the tasks of a UMJoin. */
sealed trait InputPlacement

object InputPlacement {
  /** Every task gets the whole input; Spark's broadcast exchange builds its store once. */
  case object Broadcast extends InputPlacement
  /** The streamed input, read as its child delivers it (every other input is broadcast). */
  case object AsIs extends InputPlacement
  /** Hash-partitioned on the group's partition key class, like every other partitioned input. */
  final case class HashPartitioned(key: Expression) extends InputPlacement
}

/** What planning knows about an input: its estimated size and whether it may or must be broadcast. */
final case class InputFacts(sizeInBytes: BigInt, canBroadcast: Boolean, mustBroadcast: Boolean)

/**
 * A group that can run as one UMJoin. Indexed by input: `storeKeys(i)` indexes input i's store,
 * `probeKeys(i)` computes the matching key from inputs earlier in `probeOrder`, and
 * `conditions(i)` are checked as soon as input i is bound. The streamed input (head of
 * `probeOrder`) is never stored, so its keys are empty.
 */
final case class UMJoinPlan(
    placements: Seq[InputPlacement],
    probeOrder: Seq[Int],
    storeKeys: Seq[Seq[Expression]],
    probeKeys: Seq[Seq[Expression]],
    conditions: Seq[Seq[Expression]]) {
  def streamed: Int = probeOrder.head
}

object UMJoinPlan {

  /**
   * The plans this group can run with, best first: the streamed input is the largest input that
   * need not be broadcast, every input small enough is broadcast, and the rest must be
   * co-partitioned on one key class (distribution is correctness: matching rows must meet in one
   * task). Later candidates stream a smaller input; planning takes the first one Spark can run
   * (under AQE, an input already broadcast must keep the key it was broadcast with).
   */
  def candidates(graph: JoinGraph, facts: Seq[InputFacts]): Either[String, Seq[UMJoinPlan]] = {
    if (!graph.isConnected) return Left("its inputs are not all connected by equi-join keys")
    val streamable = facts.indices.filterNot(facts(_).mustBroadcast).sortBy(i => (-facts(i).sizeInBytes, i))
    if (streamable.isEmpty) return Left("every input is an already broadcast stage")
    val tooLarge = facts.indices.filter(i => !facts(i).canBroadcast && !facts(i).mustBroadcast).toSet
    val plans = streamable.flatMap { streamed =>
      val partitioned = (tooLarge + streamed).toSeq.sorted
      placements(graph, partitioned, facts.size).map(p => plan(graph, streamed, p))
    }
    if (plans.nonEmpty) Right(plans)
    else Left(s"inputs ${tooLarge.toSeq.sorted.mkString(", ")} are too large to broadcast and share no join key class")
  }

  private def placements(graph: JoinGraph, partitioned: Seq[Int], n: Int): Option[Seq[InputPlacement]] =
    if (partitioned.size == 1) {
      Some((0 until n).map(i => if (i == partitioned.head) InputPlacement.AsIs else InputPlacement.Broadcast))
    } else {
      // Of the classes every partitioned input takes part in, the one most inputs join on (a star's
      // centre), integral keys first: they spread rows better than, say, a price.
      val covering = graph.classes.filter(c => partitioned.forall(c.inputs.contains))
      covering.sortBy(c => (-c.inputs.size, !isIntegral(c.members.head._2.dataType))).headOption.map { keyClass =>
        (0 until n).map { i =>
          if (partitioned.contains(i)) InputPlacement.HashPartitioned(keyClass.keyOf(i).get) else InputPlacement.Broadcast
        }
      }
    }

  private def isIntegral(t: DataType): Boolean = Seq(ByteType, ShortType, IntegerType, LongType).contains(t)

  private def plan(graph: JoinGraph, streamed: Int, placements: Seq[InputPlacement]): UMJoinPlan = {
    val order = ProbeOrder.fixed(graph, streamed)
    val position = order.zipWithIndex.toMap
    val n = graph.numInputs
    val storeKeys = Array.fill(n)(Seq.empty[Expression])
    val probeKeys = Array.fill(n)(Seq.empty[Expression])
    val conditions = Array.fill(n)(Seq.empty[Expression])
    order.zipWithIndex.foreach { case (input, step) =>
      if (step > 0) {
        val shared = graph.sharedClasses(input, order.take(step).toSet).map(graph.classes)
        storeKeys(input) = shared.map(_.keyOf(input).get)
        // Each class's value comes from the first input in probe order that carries it.
        probeKeys(input) = shared.map(c => c.keyOf(c.inputs.minBy(position)).get)
      }
    }
    // An input with two expressions in one class: the key covers the first, a condition the others.
    graph.classes.foreach { c =>
      c.members.groupBy(_._1).foreach { case (input, exprs) =>
        exprs.tail.foreach { case (_, other) => conditions(input) :+= EqualTo(exprs.head._2, other) }
      }
    }
    graph.residuals.foreach { r =>
      val lastBound = if (r.inputs.isEmpty) streamed else r.inputs.maxBy(position)
      conditions(lastBound) :+= r.condition
    }
    UMJoinPlan(placements, order, storeKeys.toSeq, probeKeys.toSeq, conditions.toSeq)
  }
}
