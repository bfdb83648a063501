package umjoin.spark.core.probe

import scala.collection.mutable

import org.apache.spark.sql.catalyst.expressions.{Attribute, BinaryComparison, Cast, EqualNullSafe,
  EqualTo, Expression, IsNull, PredicateHelper}

import umjoin.spark.core.{JoinGraph, ResidualCondition}
import umjoin.spark.core.cost.ProbeGraph

/**
 * An index of a store: its key is the input's expression for each of `classes`, in this order. An
 * index on several classes is a multi-column key, probed once all its classes are bound.
 */
final case class StoreIndex(classes: Seq[Int])

object StoreIndex {
  def single(keyClass: Int): StoreIndex = StoreIndex(Seq(keyClass))
}

/**
 * How a route runs over a join graph. Each step probes one index of the probed store whose classes
 * are all bound: one through the route's edge where there is one, the widest such;
 * every other equality the join requires (further classes already bound, further expressions of an
 * input in a class) becomes a condition, with the residual conditions, checked as soon as the
 * inputs it reads are bound, those that cannot fail first ([[ConditionOrder]]). So any route over
 * any indexes computes the same join.
 */
object ProbeSteps extends PredicateHelper {

  /**
   * Pairs of inputs sharing a key class: the edges probe routes may take (none from a filter, which
   * binds no key).
   */
  def graph(joinGraph: JoinGraph): ProbeGraph = ProbeGraph(joinGraph.numInputs,
    for (i <- joinGraph.joined; j <- 0 until joinGraph.numInputs
         if i != j && joinGraph.classes.exists(c => c.inputs.contains(i) && c.inputs.contains(j)))
      yield (i, j))

  /** The steps of `route`; `indexed(i)` are the indexes input i's store can be probed through. */
  def along(joinGraph: JoinGraph, route: Route, indexed: Int => Seq[StoreIndex]): Route.Plan = {
    val classes = joinGraph.classes
    // bound class -> its value (the first bound expression)
    val value = mutable.Map[Int, Expression]()
    val placed = mutable.Set[ResidualCondition]()

    /**
     * Binds `input`: the equalities of its expressions with the classes' values, new classes'
     * values, residuals now complete; as (the conditions deciding which of its rows match: an outer
     * input's ON clause, everything else for other inputs; the conditions checked after that: an
     * outer input's others).
     */
    def bind(input: Int, probed: Seq[Int], bound: Set[Int]): (Seq[Expression], Seq[Expression]) = {
      val equalities = classes.indices.flatMap { c =>
        val mine = classes(c).members.collect { case (`input`, e) => e }
        if (mine.isEmpty) Nil
        else value.get(c) match {
          // The probe already matched the store's key for this class: check its other expressions
          // only.
          case Some(v) if probed.contains(c) => mine.tail.map(EqualTo(v, _))
          case Some(v) => mine.map(EqualTo(v, _))
          case None if joinGraph.filters.contains(input) =>
            throw new IllegalStateException(
              s"filter input $input is probed before its key class $c is bound")
          case None =>
            value(c) = mine.head
            mine.tail.map(EqualTo(mine.head, _))
        }
      }
      val nowBound = bound + input
      val residuals =
        joinGraph.residuals.filter(r => !placed.contains(r) && r.inputs.subsetOf(nowBound))
      placed ++= residuals
      if (!joinGraph.outer.contains(input))
        (ConditionOrder.cheapFirst(equalities ++ residuals.map(_.condition)), Nil)
      else {
        val (on, after) = residuals.partition(_.outer.contains(input))
        (ConditionOrder.cheapFirst(on.map(_.condition)),
          ConditionOrder.cheapFirst(equalities ++ after.map(_.condition)))
      }
    }

    // A route's start row is one of its input's rows, never NULLs: an outer input's ON clause and
    // its conditions after it both filter it.
    val startConditions =
      bind(route.start, Nil, Set.empty) match { case (deciding, after) => deciding ++ after }
    var bound = Set(route.start)
    val steps = route.edges.map { case (from, to) =>
      // Through the edge's own class (shared by `from` and `to`): the statistics of the edge
      // describe probes through it, and a bound class `from` does not share may be far less
      // selective (Q5's supplier by nation instead of by supplier key: 400 candidates per probe
      // instead of one). Of those, the widest index: every class it covers narrows the candidates.
      // An outer input is probed by its ON clause's keys only, once everything its ON clause reads
      // is bound.
      val usable = joinGraph.outer.get(to) match {
        case Some(on) => indexed(to).filter(_.classes.sorted == on.sorted)
          .filter(_ => joinGraph.onInputs(to).subsetOf(bound))
        case None => usableIndexes(joinGraph, to, indexed(to), value.contains)
      }
      val index = usable.sortBy(ix =>
        (!ix.classes.exists(c => classes(c).inputs.contains(from)), -ix.classes.size)).headOption
        .getOrElse(throw new IllegalStateException(
          s"no index of input $to fits the classes bound before it in route ${route.order}"))
      val probeKeys =
        index.classes.map(c => value(servingClass(joinGraph, to, c, value.contains).get))
      val (conditions, after) = bind(to, index.classes, bound)
      bound += to
      val firstMatchDecides = joinGraph.outer.contains(to) && after.exists(failsOnEveryMatch(_,
        index.classes.flatMap(c => classes(c).keyOf(to)), conditions))
      Route.Step(to, from, index, probeKeys, conditions, joinGraph.stepRule(to), after,
        firstMatchDecides = firstMatchDecides)
    }
    Route.Plan(route, startConditions, steps)
  }

  /**
   * The bound class whose value probes input `to`'s key of class c: c, or else a bound class in
   * which `to`'s key is the same expression (an index of one class serves the other: the rows it
   * finds agree on both).
   */
  def servingClass(joinGraph: JoinGraph, to: Int, c: Int, isBound: Int => Boolean): Option[Int] =
    if (isBound(c)) Some(c)
    else joinGraph.classes(c).keyOf(to).flatMap { key =>
      joinGraph.classes.indices.find(o => isBound(o) &&
        joinGraph.classes(o).keyOf(to).exists(_.semanticEquals(key)))
    }

  /**
   * Of `indexes` of input `to`, those whose classes are all bound; if none is, those whose classes
   * are all served ([[servingClass]]).
   */
  def usableIndexes(joinGraph: JoinGraph, to: Int, indexes: Seq[StoreIndex],
      isBound: Int => Boolean): Seq[StoreIndex] =
    indexes.filter(_.classes.forall(isBound)) match {
      case Seq() =>
        indexes.filter(_.classes.forall(servingClass(joinGraph, to, _, isBound).isDefined))
      case allBound => allBound
    }

  /**
   * Whether `post`, a condition after an outer input's ON clause, fails for every row that clause
   * matches: it is `IS NULL` of a column a match makes non-NULL, the input's key in a class it is
   * probed by (a NULL key matches nothing) or a column an ON conjunct compares (not null-safe).
   */
  private def failsOnEveryMatch(post: Expression, probedKeys: Seq[Expression],
      on: Seq[Expression]): Boolean = post match {
    case IsNull(a: Attribute) =>
      (probedKeys.flatMap(column) ++ on.flatMap(comparedColumns)).exists(_.semanticEquals(a))
    case _ => false
  }

  /**
   * The columns a conjunct of `condition` compares (not null-safe), directly or cast: none is NULL
   * where `condition` holds.
   */
  def comparedColumns(condition: Expression): Seq[Attribute] =
    splitConjunctivePredicates(condition).flatMap {
      case c: BinaryComparison if !c.isInstanceOf[EqualNullSafe] =>
        column(c.left).toSeq ++ column(c.right)
      case _ => Nil
    }

  private def column(e: Expression): Option[Attribute] = e match {
    case a: Attribute => Some(a)
    case c: Cast => column(c.child)  // a cast is NULL where its input is
    case _ => None
  }
}
