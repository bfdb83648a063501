package umjoin.spark.planning

import org.apache.spark.sql.catalyst.expressions.Expression
import org.apache.spark.sql.types.{ByteType, DataType, IntegerType, LongType, ShortType}

import umjoin.spark.order.{ProbeOrder, ProbeRoute}

/** How an input's rows reach the tasks of a UMJoin. */
sealed trait InputPlacement

object InputPlacement {
  /** Every task gets the whole input (as a hash table or as rows: `UMJoinExec.broadcastMode`). */
  case object Broadcast extends InputPlacement
  /** The streamed input, read as its child delivers it (every other input is broadcast). */
  case object AsIs extends InputPlacement
  /** Hash-partitioned on the group's partition key class, like every other partitioned input. */
  final case class HashPartitioned(key: Expression) extends InputPlacement
}

/** What planning knows about an input: its estimated size and whether it may or must be broadcast. */
final case class InputFacts(sizeInBytes: BigInt, canBroadcast: Boolean, mustBroadcast: Boolean)

/**
 * A group that can run as one UMJoin: its join graph, where each input's rows go, the initial probe route of the
 * streamed input (`route.start`), and per input the indexes of its store (none for the streamed
 * input, which is never stored). With the fixed probe order a store has one index, on every class
 * it shares with the inputs probed before it; with an adaptive one, an index on each class it shares
 * with another input, so that any valid route can run.
 */
final case class UMJoinPlan(graph: JoinGraph, placements: Seq[InputPlacement], route: ProbeRoute, indexes: Seq[Seq[StoreIndex]]) {
  def streamed: Int = route.start
}

object UMJoinPlan {

  /**
   * The plans this group can run with, best first: the streamed input is the largest input that
   * need not be broadcast, every input small enough is broadcast, and the rest must be
   * co-partitioned on one key class (distribution is correctness: matching rows must meet in one
   * task). Later candidates stream a smaller input; planning takes the first one Spark can run.
   */
  def candidates(graph: JoinGraph, facts: Seq[InputFacts], adaptive: Boolean): Either[String, Seq[UMJoinPlan]] = {
    if (!graph.isConnected) return Left("its inputs are not all connected by equi-join keys")
    if (adaptive && graph.filters.nonEmpty) return Left("adaptive probe orders reorder inner joins only, and the group has semi or anti joins")
    // A filter (semi or anti join) is probed, never streamed: its rows match combinations, not the reverse.
    val streamable = graph.joined.filterNot(facts(_).mustBroadcast).sortBy(i => (-facts(i).sizeInBytes, i))
    if (streamable.isEmpty) return Left("every input is an already broadcast stage")
    val tooLarge = facts.indices.filter(i => !facts(i).canBroadcast && !facts(i).mustBroadcast).toSet
    val plans = streamable.flatMap { streamed =>
      val partitioned = (tooLarge + streamed).toSeq.sorted
      placements(graph, partitioned, facts.size).map(p => plan(graph, streamed, p, adaptive))
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

  private def plan(graph: JoinGraph, streamed: Int, placements: Seq[InputPlacement], adaptive: Boolean): UMJoinPlan = {
    val probeGraph = ProbeSteps.graph(graph)
    val shared = (0 until graph.numInputs).map(i => graph.classes.indices.filter(c => graph.classes(c).inputs.contains(i) && graph.classes(c).inputs.size > 1))
    // Filters last: their conditions read the inputs of their joins' preserved sides, all bound by then.
    val route = ProbeOrder.following(probeGraph, streamed, graph.joined ++ graph.filters.keys.toSeq.sorted)
    val indexes =
      if (adaptive) shared.indices.map(i => if (i == streamed) Nil else shared(i).map(StoreIndex.single))
      else {
        // One index per store, on every class it shares with the inputs bound before it: the
        // multi-column key Spark's own join would use (Q9's partsupp on part and supplier key).
        (0 until graph.numInputs).map { i =>
          if (i == streamed) Nil else Seq(StoreIndex(graph.sharedClasses(i, route.order.takeWhile(_ != i).toSet)))
        }
      }
    UMJoinPlan(graph, placements, route, indexes)
  }
}
