package umjoin.spark.core.cost

import scala.collection.mutable

import umjoin.spark.core.probe.Route

/**
 * The join graph as the policies see it: which pairs of inputs share a join key (both directions).
 */
final case class ProbeGraph(inputs: Int, edges: Seq[(Int, Int)]) {
  def connected(from: Int, to: Int): Boolean = edges.contains((from, to))
}

/** How a store's query cost grows with its keys (dpPick paper 001, Eq. 5 and 6). */
sealed trait StoreStructure

object StoreStructure {
  /** Eq. 5, f = c + kappa / 2m: a hash table (c = 1; m slots, kept at least twice the keys). */
  case object Hash extends StoreStructure
  /** Eq. 6, f = log(kappa): a sorted structure (RocksDB, the state stores). */
  case object Sorted extends StoreStructure
}

/**
 * Eq. 4-8: C(o_i) = alphaQuery * f(kappa_r) + gamma_r * (alphaMatch * mu_r + C(o_{i+1})), C(o_n) =
 * 0. `fanOut(edge)` (default 1): into how many partitions a probe along that edge goes. A streaming
 * UMJoin's row that does not carry the class a store is partitioned by probes every partition of
 * it (CLASH's chi, paper 002); its statistics count each of those probes, so the whole step costs
 * that many.
 */
final case class CostModel(alphaQuery: Double, alphaMatch: Double, structure: StoreStructure,
    fanOut: Map[(Int, Int), Double] = Map.empty) {
  def fanOutOf(edge: (Int, Int)): Double = fanOut.getOrElse(edge, 1.0)

  def f(keys: Double): Double = structure match {
    case StoreStructure.Hash => 1.0 + keys / (2 * math.max(64.0, 2 * keys))
    case StoreStructure.Sorted => math.log(math.max(keys, 1.0))
  }

  /** The expected cost of one step along `edge` and everything after it (Eq. 8). */
  def step(edge: (Int, Int), stats: CycleStatistics, rest: Double): Double = {
    val (gamma, mu) = stats.rateOf(edge)
    fanOutOf(edge) * (alphaQuery * f(stats.keys(edge._2)) + gamma * (alphaMatch * mu + rest))
  }
}

/**
 * The probe-order policies: given the graph and (forecast) statistics, a route for each start
 * input.
 */
sealed trait ProbeOrderPolicy {
  /** The value of spark.umjoin.probeOrder that selects it. */
  def name: String
  def routes(graph: ProbeGraph, stats: CycleStatistics, cost: CostModel,
      starts: Seq[Int]): Map[Int, Route]
}

object ProbeOrderPolicy {

  val byName: Map[String, ProbeOrderPolicy] =
    Seq(Fixed, SelectivityFirst, Greedy, DpPick).map(p => p.name -> p).toMap

  /** The plan's order: the leftmost input connected to those bound (statistics are not used). */
  case object Fixed extends ProbeOrderPolicy {
    override val name = "fixed"
    override def routes(graph: ProbeGraph, stats: CycleStatistics, cost: CostModel,
        starts: Seq[Int]): Map[Int, Route] =
      starts.map(s => s -> ProbeOrder.fixed(graph, s)).toMap
  }

  /** MJoin / GrubJoin: next, the store with the fewest expected rows per probe (gamma * mu). */
  case object SelectivityFirst extends ProbeOrderPolicy {
    override val name = "selectivityFirst"
    override def routes(graph: ProbeGraph, stats: CycleStatistics, cost: CostModel,
        starts: Seq[Int]): Map[Int, Route] =
      starts.map(s => s -> ProbeOrder.stepwise(graph, s) { (from, to) =>
        val (gamma, mu) = stats.rateOf((from, to))
        cost.fanOutOf((from, to)) * gamma * mu
      }).toMap
  }

  /** MultiStream: next, the step of least cost on its own (Eq. 8 without what follows). */
  case object Greedy extends ProbeOrderPolicy {
    override val name = "greedy"
    override def routes(graph: ProbeGraph, stats: CycleStatistics, cost: CostModel,
        starts: Seq[Int]): Map[Int, Route] =
      starts.map(s =>
        s -> ProbeOrder.stepwise(graph, s)((from, to) => cost.step((from, to), stats, 0.0))).toMap
  }

  /**
   * dpPick (Algorithm 3): of all sequences of the join graph, the one of least Eq. 8 cost per
   * start.
   */
  case object DpPick extends ProbeOrderPolicy {
    override val name = "dpPick"
    override def routes(graph: ProbeGraph, stats: CycleStatistics, cost: CostModel,
        starts: Seq[Int]): Map[Int, Route] =
      ProbeOrder.dpPick(graph, stats, cost)
        .collect { case (start, (route, _)) if starts.contains(start) => start -> route }
  }
}

object ProbeOrder {

  /**
   * A route's expected cost per streamed row by Eq. 8 (the sum over its steps, from the last back).
   */
  def cost(route: Route, stats: CycleStatistics, model: CostModel): Double =
    route.edges.foldRight(0.0)((edge, rest) => model.step(edge, stats, rest))

  /**
   * The plan's order from `start`: the leftmost input connected to those bound, from the leftmost
   * bound one.
   */
  def fixed(graph: ProbeGraph, start: Int): Route = following(graph, start, 0 until graph.inputs)

  /**
   * The route from `start` that binds inputs in the order of `preference` as far as the graph
   * allows (next, the first preferred input connected to those bound), each probed from the input
   * bound earliest that connects to it.
   */
  def following(graph: ProbeGraph, start: Int, preference: Seq[Int]): Route = {
    val rank = preference.zipWithIndex.toMap
    stepwise(graph, start)((_, to) => rank(to).toDouble)
  }

  /**
   * Builds a route one step at a time, taking the edge (bound -> unbound) of least `score`; on a
   * tie, the edge from the input bound earliest, then to the lowest input.
   */
  def stepwise(graph: ProbeGraph, start: Int)(score: (Int, Int) => Double): Route = {
    val boundAt = mutable.LinkedHashMap(start -> 0)
    val edges = mutable.ArrayBuffer[(Int, Int)]()
    while (boundAt.size < graph.inputs) {
      val candidates =
        graph.edges.filter { case (from, to) => boundAt.contains(from) && !boundAt.contains(to) }
      require(candidates.nonEmpty, "probe orders need a connected join graph")
      val next = candidates.minBy { case (from, to) => (score(from, to), boundAt(from), to) }
      edges += next
      boundAt(next._2) = boundAt.size
    }
    Route(start, edges.toSeq)
  }

  /** Algorithm 4 (getSequences): every sequence of edges that reaches all inputs from `start`. */
  def sequences(graph: ProbeGraph, start: Int): Seq[List[(Int, Int)]] = {
    val all = mutable.ArrayBuffer[List[(Int, Int)]]()
    def dfs(visited: Set[Int], reversed: List[(Int, Int)]): Unit =
      if (visited.size == graph.inputs) all += reversed.reverse
      else graph.edges.foreach { case edge @ (from, to) =>
        if (visited.contains(from) && !visited.contains(to)) dfs(visited + to, edge :: reversed)
      }
    dfs(Set(start), Nil)
    all.toSeq
  }

  /**
   * Algorithm 3 (optimizeProbeOrder_dpPick): each sequence's cost by Eq. 8, a sub-sequence's cost
   * computed once and remembered; per start input the sequence of least cost, with that cost.
   */
  def dpPick(graph: ProbeGraph, stats: CycleStatistics,
      cost: CostModel): Map[Int, (Route, Double)] = {
    val memo = mutable.HashMap[List[(Int, Int)], Double](Nil -> 0.0)
    def calculateCost(edge: (Int, Int), rest: List[(Int, Int)]): Double = {
      val restCost = memo.getOrElse(rest, {
        val c = calculateCost(rest.head, rest.tail)
        memo(rest) = c
        c
      })
      cost.step(edge, stats, restCost)
    }
    val best = mutable.LinkedHashMap[Int, (Route, Double)]()
    (0 until graph.inputs).foreach { start =>
      sequences(graph, start).foreach { sequence =>
        val c = calculateCost(sequence.head, sequence.tail)
        if (best.get(start).forall(c < _._2)) best(start) = (Route(start, sequence), c)
      }
    }
    best.toMap
  }
}
