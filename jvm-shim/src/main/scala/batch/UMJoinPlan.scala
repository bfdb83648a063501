package umjoin.spark.batch

import scala.collection.mutable

import org.apache.spark.sql.catalyst.expressions.Expression
import org.apache.spark.sql.types.{ByteType, DataType, IntegerType, LongType, ShortType}

import umjoin.spark.core.JoinGraph
import umjoin.spark.core.probe.{Route, StoreIndex}

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

/**
 * What planning knows about an input: its estimated size and whether it may or must be broadcast.
 */
final case class InputFacts(sizeInBytes: BigInt, canBroadcast: Boolean, mustBroadcast: Boolean)

/**
 * A group that can run as one UMJoin: its join graph, where each input's rows go, the initial probe
 * route of the streamed input (`route.start`), and per input the indexes of its store (none for the
 * streamed input, which is never stored). With the fixed probe order a store has one index, on
 * every class it shares with the inputs probed before it; with an adaptive one, an index on each
 * class it shares with another input, so that any valid route can run.
 */
final case class UMJoinPlan(graph: JoinGraph, placements: Seq[InputPlacement], route: Route,
    indexes: Seq[Seq[StoreIndex]]) {
  def streamed: Int = route.start
}

object UMJoinPlan {

  /**
   * The plans this group can run with, best first: the streamed input is the largest input that
   * need not be broadcast, every input small enough is broadcast, and the rest must be
   * co-partitioned on one key class (distribution is correctness: matching rows must meet in one
   * task). Later candidates stream a smaller input; planning takes the first one Spark can run.
   */
  def candidates(graph: JoinGraph, facts: Seq[InputFacts],
      adaptive: Boolean): Either[String, Seq[UMJoinPlan]] = {
    if (!graph.isConnected) return Left("its inputs are not all connected by equi-join keys")
    if (adaptive && (graph.filters.nonEmpty || graph.outer.nonEmpty))
      return Left("adaptive probe orders reorder inner joins only, and the group has semi, anti " +
        "or outer joins")
    // A filter (semi or anti join) or an outer join's non-preserved side is probed, never streamed:
    // its rows match combinations, not the reverse.
    val streamable = graph.joined.filterNot(i => facts(i).mustBroadcast || graph.outer.contains(i))
      .sortBy(i => (-facts(i).sizeInBytes, i))
    if (streamable.isEmpty) return Left("every input is an already broadcast stage")
    val tooLarge =
      facts.indices.filter(i => !facts(i).canBroadcast && !facts(i).mustBroadcast).toSet
    val plans = streamable.flatMap { streamed =>
      val partitioned = (tooLarge + streamed).toSeq.sorted
      placements(graph, partitioned, facts.size).flatMap(p => plan(graph, streamed, p, adaptive))
    }
    if (plans.nonEmpty) Right(plans)
    else Left(s"inputs ${tooLarge.toSeq.sorted.mkString(", ")}" +
      " are too large to broadcast and share no join key class")
  }

  private def placements(graph: JoinGraph, partitioned: Seq[Int],
      n: Int): Option[Seq[InputPlacement]] =
    if (partitioned.size == 1) {
      Some((0 until n).map(i =>
        if (i == partitioned.head) InputPlacement.AsIs else InputPlacement.Broadcast))
    } else {
      // Of the classes every partitioned input takes part in, the one most inputs join on (a star's
      // centre), integral keys first: they spread rows better than, say, a price.
      val covering = graph.classes.filter(c => partitioned.forall(c.inputs.contains))
      covering.sortBy(c => (-c.inputs.size, !isIntegral(c.members.head._2.dataType))).headOption
        .map { keyClass =>
          (0 until n).map { i =>
            if (partitioned.contains(i))
              InputPlacement.HashPartitioned(keyClass.keyOf(i).get) else InputPlacement.Broadcast
          }
        }
    }

  private def isIntegral(t: DataType): Boolean =
    Seq(ByteType, ShortType, IntegerType, LongType).contains(t)

  /** The plan streaming `streamed`, if a route from it can probe every input. */
  private def plan(graph: JoinGraph, streamed: Int, placements: Seq[InputPlacement],
      adaptive: Boolean): Option[UMJoinPlan] = {
    val shared = (0 until graph.numInputs).map(i => graph.classes.indices.filter(c =>
      graph.classes(c).inputs.contains(i) && graph.classes(c).inputs.size > 1))
    fixedRoute(graph, streamed).map { route =>
      val indexes =
        if (adaptive)
          shared.indices.map(i => if (i == streamed) Nil else shared(i).map(StoreIndex.single))
        else {
          // One index per store, on every class it shares with the inputs bound before it: the
          // multi-column key Spark's own join would use (Q9's partsupp on part and supplier key).
          // An outer join's non-preserved side is probed by its ON clause's keys alone.
          (0 until graph.numInputs).map { i =>
            if (i == streamed) Nil
            else Seq(StoreIndex(graph.outer.getOrElse(i,
              graph.sharedClasses(i, route.order.takeWhile(_ != i).toSet)).sorted))
          }
        }
      UMJoinPlan(graph, placements, route, indexes)
    }
  }

  /**
   * The plan's route from `streamed`: next, the first input in the order the plan names them that
   * can be probed now, each from the input bound earliest that shares a key class with it. Inputs
   * that bind rows come first; an outer join's non-preserved side once all its ON clause reads is
   * bound (and from one of those); filters (semi and anti joins) last, their conditions reading the
   * inputs bound before. None when some input can never be probed from `streamed`.
   */
  def fixedRoute(graph: JoinGraph, streamed: Int): Option[Route] = {
    val order = mutable.ArrayBuffer(streamed)
    val edges = mutable.ArrayBuffer[(Int, Int)]()
    def shareClass(a: Int, b: Int): Boolean =
      graph.classes.exists(c => c.inputs.contains(a) && c.inputs.contains(b))
    def fromOf(x: Int): Option[Int] = graph.outer.get(x) match {
      case Some(on) if graph.onInputs(x).subsetOf(order.toSet) =>
        order.find(b => on.exists(graph.classes(_).inputs.contains(b)))
      case Some(_) => None
      case None if graph.filters.contains(x) && !graph.joined.forall(order.contains) => None
      case None => order.find(b => !graph.filters.contains(b) && shareClass(b, x))
    }
    val preference = graph.joined ++ graph.filters.keys.toSeq.sorted
    while (order.size < graph.numInputs) {
      preference.iterator.filterNot(order.contains).map(x => fromOf(x).map(_ -> x))
        .collectFirst { case Some(edge) => edge } match {
          case Some((from, to)) =>
            edges += ((from, to))
            order += to
          case None => return None
        }
    }
    Some(Route(streamed, edges.toSeq))
  }
}
