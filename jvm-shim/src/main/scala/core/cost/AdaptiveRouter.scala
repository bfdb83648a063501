package umjoin.spark.core.cost

import org.apache.spark.internal.Logging

import umjoin.spark.core.probe.Route

/**
 * The adaptive probe-order cycle (dpPick paper 001, Algorithm 1), the one used by batch tasks, the
 * streaming driver and the arrival replay: a cycle's probe counters become one cycle of statistics
 * ([[record]]), and the policy chooses the route of every start input again from the forecast of
 * the last `settings.history` cycles ([[choose]]). When a cycle ends is the caller's: every
 * `cycleRows` streamed rows of a batch task, every `periodMs` between micro-batches.
 */
final class AdaptiveRouter(settings: ProbeOrderSettings, graph: ProbeGraph, cost: CostModel,
    initial: Map[Int, Route]) extends Logging {
  private val history = new StatisticsHistory(settings.history)
  private var current = initial

  /** The routes chosen last (the initial ones before any choice), by start input. */
  def routes: Map[Int, Route] = current

  def hasStatistics: Boolean = !history.isEmpty

  /** Ends a cycle: its counters, and each store's number of keys (`keys`, by input). */
  def record(counters: ProbeCounters, keys: IndexedSeq[Double]): Unit =
    history.add(counters.cycle(keys))

  /**
   * Chooses every start's route again from the forecast; returns the starts whose route changed.
   */
  def choose(): Seq[Int] = {
    val forecast = history.forecast(settings.smoothing)
    val starts = current.keys.toSeq.sorted
    val chosen = settings.policy.routes(graph, forecast, cost, starts)
    val changed = starts.filter(s => chosen(s) != current(s))
    logDebug(s"UMJoin ${settings.policy.name}" +
      s": routes ${starts.map(s => chosen(s).order.mkString("->")).mkString(", ")} " +
      s"(changed from ${changed.map(s => current(s).order.mkString("->")).mkString(", ")}) " +
      s"from gamma ${forecast.matchRate}, mu ${forecast.matchesPerSuccess}, kappa ${forecast.keys}")
    current = starts.map(s => s -> chosen(s)).toMap
    changed
  }
}
