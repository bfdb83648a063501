package umjoin.spark.core.cost

/**
 * One cycle's statistics (dpPick paper 001, 4.3): per probe pair (the bound input whose key is used
 * -> the store probed) the match rate gamma = probes that found rows / probes and the rows per
 * successful probe mu; per store its number of keys kappa. Pairs not probed in the cycle are
 * absent.
 */
final case class CycleStatistics(matchRate: Map[(Int, Int), Double],
    matchesPerSuccess: Map[(Int, Int), Double], keys: IndexedSeq[Double]) {

  /**
   * gamma and mu of a probe pair. A pair not observed takes the mean of the pairs observed into the
   * same store (the store is the same, only the bound rows differ), else 1 and 1: no evidence.
   * Without this, a route's unobserved pairs look cheaper than the observed ones into the same
   * store, and a policy would keep trying them.
   */
  def rateOf(edge: (Int, Int)): (Double, Double) =
    (matchRate.getOrElse(edge, storeMatchRate.getOrElse(edge._2, 1.0)),
      matchesPerSuccess.getOrElse(edge, storeMatchesPerSuccess.getOrElse(edge._2, 1.0)))

  private lazy val storeMatchRate: Map[Int, Double] = meanByStore(matchRate)
  private lazy val storeMatchesPerSuccess: Map[Int, Double] = meanByStore(matchesPerSuccess)

  private def meanByStore(byPair: Map[(Int, Int), Double]): Map[Int, Double] =
    byPair.groupBy(_._1._2).map { case (store, pairs) => store -> pairs.values.sum / pairs.size }
}

/**
 * Counters filled while probing, one cycle at a time. Mergeable: tasks' counters add up on the
 * driver.
 */
final class ProbeCounters(val inputs: Int) extends Serializable {
  private val probes = Array.ofDim[Long](inputs, inputs)
  private val successes = Array.ofDim[Long](inputs, inputs)
  private val matches = Array.ofDim[Long](inputs, inputs)
  /** Rows (or keys) stored per input, where the probing side reports them (streaming state). */
  val stored = new Array[Long](inputs)

  /** One probe along `from -> to` that found `found` rows. */
  def record(from: Int, to: Int, found: Long): Unit = {
    probes(from)(to) += 1
    if (found > 0) {
      successes(from)(to) += 1
      matches(from)(to) += found
    }
  }

  def isEmpty: Boolean = probes.forall(_.forall(_ == 0))

  def add(other: ProbeCounters): Unit = {
    for (i <- 0 until inputs; j <- 0 until inputs) {
      probes(i)(j) += other.probes(i)(j)
      successes(i)(j) += other.successes(i)(j)
      matches(i)(j) += other.matches(i)(j)
    }
    for (i <- 0 until inputs) stored(i) += other.stored(i)
  }

  def reset(): Unit = {
    Seq(probes, successes, matches).foreach(_.foreach(row => java.util.Arrays.fill(row, 0L)))
    java.util.Arrays.fill(stored, 0L)
  }

  /** This cycle's gamma and mu for every pair probed, with the stores' key counts. */
  def cycle(keys: IndexedSeq[Double]): CycleStatistics = {
    val pairs = for (i <- 0 until inputs; j <- 0 until inputs if probes(i)(j) > 0) yield (i, j)
    CycleStatistics(
      pairs.map(p => p -> successes(p._1)(p._2).toDouble / probes(p._1)(p._2)).toMap,
      pairs.filter(p => successes(p._1)(p._2) > 0).map(p =>
        p -> matches(p._1)(p._2).toDouble / successes(p._1)(p._2)).toMap,
      keys)
  }

  def copy(): ProbeCounters = {
    val c = new ProbeCounters(inputs)
    c.add(this)
    c
  }
}
