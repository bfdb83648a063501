package umjoin.spark.planning

import scala.collection.mutable

import org.apache.spark.sql.catalyst.expressions.{EqualTo, Expression}

import umjoin.spark.order.{ProbeGraph, ProbeRoute}

/**
 * One step of a probe route: `input`'s store is probed through its index on `keyClass` with
 * `probeKey` (the class's value, from an input bound earlier); `conditions` are checked once the
 * stored row is bound. `from` is the route's edge source, which the statistics are kept for.
 */
final case class StepPlan(input: Int, from: Int, keyClass: Int, probeKey: Expression, conditions: Seq[Expression])

/** A route turned into steps: the conditions on the start row alone, then one step per other input. */
final case class RoutePlan(route: ProbeRoute, startConditions: Seq[Expression], steps: Seq[StepPlan])

/**
 * How a route runs over a join graph. Each step probes one key class the probed store is indexed by,
 * the class of the route's edge where it can;
 * every other equality the join requires (further classes already bound, further expressions of an
 * input in a class) becomes a condition, with the residual conditions, checked as soon as the inputs
 * it reads are bound. So any route over any indexes computes the same join.
 */
object ProbeSteps {

  /** Pairs of inputs sharing a key class: the edges probe routes may take. */
  def graph(joinGraph: JoinGraph): ProbeGraph = ProbeGraph(joinGraph.numInputs,
    for (i <- 0 until joinGraph.numInputs; j <- 0 until joinGraph.numInputs
         if i != j && joinGraph.classes.exists(c => c.inputs.contains(i) && c.inputs.contains(j))) yield (i, j))

  /** The steps of `route`; `indexed(i)` are the classes input i's store can be probed by. */
  def along(joinGraph: JoinGraph, route: ProbeRoute, indexed: Int => Set[Int]): RoutePlan = {
    val classes = joinGraph.classes
    val value = mutable.Map[Int, Expression]() // bound class -> its value (the first bound expression)
    val placed = mutable.Set[ResidualCondition]()

    /** Binds `input`: the equalities of its expressions with the classes' values, new classes' values, residuals now complete. */
    def bind(input: Int, probedClass: Option[Int], bound: Set[Int]): Seq[Expression] = {
      val equalities = classes.indices.flatMap { c =>
        val mine = classes(c).members.collect { case (`input`, e) => e }
        if (mine.isEmpty) Nil
        else value.get(c) match {
          // The probe already matched the store's key for this class: check its other expressions only.
          case Some(v) if probedClass.contains(c) => mine.tail.map(EqualTo(v, _))
          case Some(v) => mine.map(EqualTo(v, _))
          case None =>
            value(c) = mine.head
            mine.tail.map(EqualTo(mine.head, _))
        }
      }
      val nowBound = bound + input
      val residuals = joinGraph.residuals.filter(r => !placed.contains(r) && r.inputs.subsetOf(nowBound))
      placed ++= residuals
      equalities ++ residuals.map(_.condition)
    }

    val startConditions = bind(route.start, None, Set.empty)
    var bound = Set(route.start)
    val steps = route.edges.map { case (from, to) =>
      // The edge's own class (shared by `from` and `to`): the statistics of the edge describe probes
      // through it, and a bound class `from` does not share may be far less selective (Q5's
      // supplier by nation instead of by supplier key: 400 candidates per probe instead of one).
      def probes(c: Int): Boolean = value.contains(c) && classes(c).inputs.contains(to) && indexed(to).contains(c)
      val probeClass = classes.indices.find(c => probes(c) && classes(c).inputs.contains(from)).orElse(classes.indices.find(probes))
        .getOrElse(throw new IllegalStateException(s"no index of input $to fits the classes bound before it in route ${route.order}"))
      val probeKey = value(probeClass)
      val conditions = bind(to, Some(probeClass), bound)
      bound += to
      StepPlan(to, from, probeClass, probeKey, conditions)
    }
    RoutePlan(route, startConditions, steps)
  }
}
