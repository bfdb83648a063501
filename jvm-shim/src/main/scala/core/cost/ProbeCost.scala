package umjoin.spark.core.cost

import scala.collection.mutable

import umjoin.spark.core.probe.Route

/**
 * A streaming group as the probe-cost model sees it (CLASH paper 002, section IV). `classes(c)`
 * holds the inputs joined on key class c. `candidates(i)` are the classes input i's store may be
 * hash-partitioned on (empty for an input broadcast to every task, which is probed where the
 * probing row is). `starts` are the inputs whose new rows probe the others: the streams (a static
 * table's rows never arrive, they are there).
 */
final case class CostGraph(numInputs: Int, classes: IndexedSeq[Set[Int]],
    candidates: IndexedSeq[Seq[Int]], starts: Seq[Int]) {
  def broadcast(input: Int): Boolean = candidates(input).isEmpty

  /** Inputs sharing a key class with `input`. */
  def neighbours(input: Int): Set[Int] = classes.filter(_.contains(input)).flatten.toSet - input
}

/**
 * Expected join sizes of sets of inputs: the product of the inputs' rates, divided by a class's
 * number of distinct values for every join that connects two more inputs of the set (the textbook
 * estimate: the smaller domain contained in the larger). Where several classes join the same
 * inputs (TPC-H's lineitem and partsupp on part and supplier key), only the most selective counts,
 * as Spark's own estimate of a join on several keys takes the key with the most distinct values:
 * the values of one row's keys go together, so dividing by every class would make such a join
 * look like almost no rows. Formally, the classes of most distinct values that span the set
 * (a maximum spanning forest).
 */
final case class JoinSizes(rates: IndexedSeq[Double], distinct: IndexedSeq[Double]) {
  def of(inputs: Set[Int], classes: IndexedSeq[Set[Int]]): Double = {
    val component = mutable.Map[Int, Int]() ++ inputs.map(i => i -> i)
    def root(i: Int): Int = if (component(i) == i) i else root(component(i))
    classes.indices.sortBy(c => (-distinct(c), c))
      .foldLeft(inputs.toSeq.map(rates).product) { (size, c) =>
        (classes(c) intersect inputs).toSeq.sorted.sliding(2).foldLeft(size) {
          case (joined, Seq(a, b)) if root(a) != root(b) =>
            component(root(b)) = root(a)
            joined / distinct(c)
          case (joined, _) => joined
        }
      }
  }
}

object JoinSizes {
  /**
   * No statistics: every rate 1 and every join 1-to-1, so only the broadcast factors tell choices
   * apart.
   */
  def uniform(numInputs: Int, numClasses: Int): JoinSizes =
    JoinSizes(IndexedSeq.fill(numInputs)(1.0), IndexedSeq.fill(numClasses)(1.0))

  /**
   * From estimated rows per input: a key class has as many distinct values as its smallest input
   * has rows (a key-foreign key join: the key side is the smallest, each of its rows a distinct
   * key).
   */
  def fromRates(rates: IndexedSeq[Double], classes: IndexedSeq[Set[Int]]): JoinSizes =
    JoinSizes(rates, classes.map(c => math.max(1.0, c.toSeq.map(rates).min)))
}

/**
 * A choice of the model: each input's partitioning class (None: broadcast), each start's route, and
 * its probe cost.
 */
final case class ProbeChoice(partitioning: IndexedSeq[Option[Int]], routes: Map[Int, Route],
    cost: Double)

/**
 * CLASH's probe cost (paper 002, Eq. 1) and the search for the partitioning and routes of least
 * cost.
 *
 * A new row of a start input probes the other stores along its route; step j (j = 1..n-1) sends
 * the partial combinations of the first j inputs to the store of the (j+1)-th:
 *   cost(step j) = |join of the first j inputs| * 1/j * chi(next store)
 * (the 1/j: a row joins only rows that came before it; the equation's indices in the paper are off
 * by one, its worked example in section V fixes them as written here). chi is 1 when the partial
 * combination carries the value of the class the next store is partitioned on (it goes to one
 * partition) or the next input is broadcast, and the number of partitions otherwise (it goes to
 * all).
 */
object ProbeCost {

  /**
   * The cost of one step: the partial combinations of `bound` (in any order) sent to `next`'s
   * store.
   */
  def step(graph: CostGraph, sizes: JoinSizes, partitioning: IndexedSeq[Option[Int]],
      partitions: Int, bound: Set[Int], next: Int): Double =
    sizes.of(bound, graph.classes) / bound.size * chi(graph, partitioning, partitions, bound, next)

  /** 1 if `next` is broadcast or its partitioning class is bound, else every partition. */
  def chi(graph: CostGraph, partitioning: IndexedSeq[Option[Int]], partitions: Int, bound: Set[Int],
      next: Int): Double =
    partitioning(next) match {
      case Some(c) if !graph.classes(c).exists(bound.contains) => partitions.toDouble
      case _ => 1.0
    }

  /** Eq. 1 for one route. */
  def route(graph: CostGraph, sizes: JoinSizes, partitioning: IndexedSeq[Option[Int]],
      partitions: Int, route: Route): Double = {
    val order = route.order
    (1 until order.size).map(j =>
      step(graph, sizes, partitioning, partitions, order.take(j).toSet, order(j))).sum
  }

  /**
   * Stored rows a route's lookups read, before their residual conditions: per step, the partial
   * combinations probing (as in Eq. 1, without chi: a combination sent to every partition reads
   * each partition's share) times the rows of one lookup, the store's rate over the distinct values
   * of what it is looked up by. That is the store's partitioning class when the combination carries
   * it, else every class of the store the combination carries (a composite index, as
   * [[StreamingLayout.steps]] runs it by default), whose most selective class counts (as in
   * [[JoinSizes]]). Eq. 1 counts probes only; this tells apart partitionings whose probes cost the
   * same but read a low-cardinality key (a nation) where a selective one (a supplier) was at hand.
   */
  def scanned(graph: CostGraph, sizes: JoinSizes, partitioning: IndexedSeq[Option[Int]],
      route: Route): Double = {
    val order = route.order
    route.edges.zipWithIndex.map { case ((_, to), s) =>
      val bound = order.take(s + 1).toSet
      val carried = graph.classes.indices.filter(c => graph.classes(c).contains(to) &&
        graph.classes(c).exists(bound.contains))
      val lookup = partitioning(to).filter(carried.contains).map(Seq(_)).getOrElse(carried)
      sizes.of(bound, graph.classes) / bound.size * sizes.rates(to) / lookup.map(sizes.distinct).max
    }.sum
  }

  /** Eq. 1 for a whole group: the sum over its start inputs' routes. */
  def total(graph: CostGraph, sizes: JoinSizes, choice: ProbeChoice, partitions: Int): Double =
    graph.starts.map(s =>
      route(graph, sizes, choice.partitioning, partitions, choice.routes(s))).sum

  /**
   * Most candidate partitionings searched exhaustively; beyond, one input's choice changes at a
   * time.
   */
  val ExhaustiveLimit = 100000

  /**
   * The partitioning and routes of least probe cost. For a given partitioning a step's cost depends
   * only on the set of inputs bound and the one probed next, so the best completion of every bound
   * set is computed once (dynamic programming over subsets) and each start's best route read off
   * it. Partitionings are searched exhaustively up to [[ExhaustiveLimit]] of them (8 inputs with up
   * to 4 candidate classes each), else by changing one input's class at a time while that helps.
   * On equal cost, the choice whose lookups read fewer stored rows wins ([[scanned]]), then the one
   * with fewer stores partitioned apart (fewer shuffles), then the earlier candidates.
   */
  def optimize(graph: CostGraph, sizes: JoinSizes, partitions: Int): ProbeChoice = {
    require(graph.numInputs <= 20, "the probe-cost search handles at most 20 inputs")
    val n = graph.numInputs
    val maskSizes =
      Array.tabulate(1 << n)(m => if (m == 0) 0.0 else sizes.of(members(m), graph.classes))
    val classMasks = graph.classes.map(c => c.foldLeft(0)((m, i) => m | (1 << i)))
    val neighbourMasks =
      (0 until n).map(i => graph.neighbours(i).foldLeft(0)((m, j) => m | (1 << j)))

    def evaluate(partitioning: IndexedSeq[Option[Int]]): Evaluated = {
      val full = (1 << n) - 1
      val best = Array.fill(1 << n)(Double.NaN)
      val nextOf = Array.fill(1 << n)(-1)
      def completion(mask: Int): Double = {
        if (mask == full) return 0.0
        if (!best(mask).isNaN) return best(mask)
        var cost = Double.PositiveInfinity
        var choice = -1
        val bound = Integer.bitCount(mask)
        var x = 0
        while (x < n) {
          if ((mask & (1 << x)) == 0 && (mask & neighbourMasks(x)) != 0) {
            val chiX = partitioning(x) match {
              case Some(c) if (mask & classMasks(c)) == 0 => partitions.toDouble
              case _ => 1.0
            }
            val c = maskSizes(mask) / bound * chiX + completion(mask | (1 << x))
            if (cost.isInfinite || c < cost - 1e-9 * cost) {
              cost = c
              choice = x
            }
          }
          x += 1
        }
        best(mask) = cost
        nextOf(mask) = choice
        cost
      }
      val routes = graph.starts.map { s =>
        completion(1 << s)
        val order = mutable.ArrayBuffer(s)
        var mask = 1 << s
        while (mask != full && nextOf(mask) >= 0) {
          order += nextOf(mask)
          mask |= 1 << nextOf(mask)
        }
        s -> routeThrough(graph, partitioning, order.toSeq)
      }.toMap
      val cost = graph.starts.map(s => best(1 << s)).sum
      Evaluated(cost, routes.values.map(r => scanned(graph, sizes, partitioning, r)).sum,
        routes.values.map(r => shuffles(graph, partitioning, r)).sum, routes)
    }

    def below(a: Double, b: Double): Boolean = a < b - 1e-9 * math.abs(b)
    def better(a: Evaluated, b: Evaluated): Boolean =
      below(a.cost, b.cost) || (!below(b.cost, a.cost) &&
        (below(a.scanned, b.scanned) || (!below(b.scanned, a.scanned) && a.shuffles < b.shuffles)))

    val options =
      (0 until n).map(i => if (graph.broadcast(i)) Seq(None) else graph.candidates(i).map(Some(_)))
    val count = options.foldLeft(BigInt(1))(_ * _.size)
    val (partitioning, result) =
      if (count <= ExhaustiveLimit) {
        var bestPartitioning: IndexedSeq[Option[Int]] = null
        var bestResult: Evaluated = null
        combinations(options).foreach { p =>
          val r = evaluate(p)
          if (bestResult == null || better(r, bestResult)) {
            bestPartitioning = p
            bestResult = r
          }
        }
        (bestPartitioning, bestResult)
      } else {
        var current = options.map(_.head)
        var currentResult = evaluate(current)
        var improved = true
        while (improved) {
          improved = false
          for (i <- 0 until n; option <- options(i) if option != current(i)) {
            val candidate = current.updated(i, option)
            val r = evaluate(candidate)
            if (better(r, currentResult)) {
              current = candidate
              currentResult = r
              improved = true
            }
          }
        }
        (current, currentResult)
      }
    require(result.cost.isFinite, "probe routes need inputs connected by join keys")
    ProbeChoice(partitioning, result.routes, result.cost)
  }

  /** A partitioning's routes with their probe cost (Eq. 1), stored rows read and shuffles. */
  private final case class Evaluated(cost: Double, scanned: Double, shuffles: Int,
      routes: Map[Int, Route])

  /**
   * The route visiting `order`, each step from the earliest bound input that carries the next
   * store's partitioning class (so the step needs no broadcast), else the earliest sharing a class.
   */
  def routeThrough(graph: CostGraph, partitioning: IndexedSeq[Option[Int]],
      order: Seq[Int]): Route = {
    val edges = order.indices.drop(1).map { j =>
      val to = order(j)
      val bound = order.take(j)
      val carriers =
        partitioning(to).map(c => bound.filter(graph.classes(c).contains)).getOrElse(Nil)
      val from = carriers.headOption.getOrElse(bound.find(graph.neighbours(to).contains).get)
      (from, to)
    }
    Route(order.head, edges)
  }

  /**
   * Steps of a route whose store is partitioned on another class than the previous one: where the
   * partial combinations are shuffled.
   */
  def shuffles(graph: CostGraph, partitioning: IndexedSeq[Option[Int]], route: Route): Int = {
    var location = partitioning(route.start)
    route.order.tail.count { next =>
      partitioning(next) match {
        case None => false
        case p =>
          val moved = p != location
          location = p
          moved
      }
    }
  }

  /** Every combination of one option per position. */
  private def combinations[A](options: IndexedSeq[Seq[A]]): Iterator[IndexedSeq[A]] =
    options.foldLeft(Iterator.single(IndexedSeq.empty[A])) { (prefixes, choices) =>
      prefixes.flatMap(prefix => choices.iterator.map(prefix :+ _))
    }

  private def members(mask: Int): Set[Int] = (0 until 31).filter(i => (mask & (1 << i)) != 0).toSet

  /**
   * CLASH (paper 002), section V: several queries over shared inputs, optimised together. A step is
   * a route prefix (the input names in order) and the input probed next; the steps of all chosen
   * routes are paid once each, so routes of different queries that start alike share their first
   * steps. Exhaustive over every route of every (query, start): meant for a few small queries,
   * as in the paper's example. Partitioning is left out (one partition), as in that example.
   */
  def optimizeJointly(
      queries: Seq[(CostGraph, IndexedSeq[String], JoinSizes)]): (Double, Seq[Map[Int, Route]]) = {
    val choices = queries.flatMap { case (graph, names, sizes) =>
      graph.starts.map { s =>
        orders(graph, s).map { order =>
          val steps = (1 until order.size).map { j =>
            (order.take(j).map(names), names(order(j))) -> step(graph, sizes,
              IndexedSeq.fill(graph.numInputs)(None), 1, order.take(j).toSet, order(j))
          }
          (order, steps)
        }
      }
    }.toIndexedSeq
    var bestCost = Double.PositiveInfinity
    var bestPick: IndexedSeq[Seq[Int]] = IndexedSeq.empty
    combinations(choices).foreach { pick =>
      val cost = pick.flatMap(_._2).toMap.values.sum
      if (cost < bestCost - 1e-9) {
        bestCost = cost
        bestPick = pick.map(_._1)
      }
    }
    var position = 0
    val routes = queries.map { case (graph, _, _) =>
      graph.starts.map { s =>
        val order = bestPick(position)
        position += 1
        s -> routeThrough(graph, IndexedSeq.fill(graph.numInputs)(None), order)
      }.toMap
    }
    (bestCost, routes)
  }

  /**
   * Every order of all inputs from `start` in which each input shares a class with one before it.
   */
  def orders(graph: CostGraph, start: Int): Seq[Seq[Int]] = {
    def extend(order: Vector[Int]): Seq[Seq[Int]] =
      if (order.size == graph.numInputs) Seq(order)
      else (0 until graph.numInputs).filter(x => !order.contains(x) &&
        order.exists(graph.neighbours(x).contains)).flatMap(x => extend(order :+ x))
    extend(Vector(start))
  }
}
