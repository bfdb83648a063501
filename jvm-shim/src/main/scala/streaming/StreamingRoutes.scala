package umjoin.spark.streaming

import java.util.UUID

import scala.collection.concurrent.TrieMap

import org.apache.spark.internal.Logging
import org.apache.spark.util.AccumulatorV2

import umjoin.spark.core.cost.{CostModel, ProbeCounters, ProbeGraph, ProbeOrderSettings, ProbeRoute, StatisticsHistory}

/** Sums the tasks' probe counters of one micro-batch, for the driver. */
final class ProbeCountersAccumulator(inputs: Int) extends AccumulatorV2[ProbeCounters, ProbeCounters] {
  private val total = new ProbeCounters(inputs)
  override def isZero: Boolean = total.isEmpty && total.stored.forall(_ == 0)
  override def copy(): ProbeCountersAccumulator = {
    val c = new ProbeCountersAccumulator(inputs)
    c.total.add(total)
    c
  }
  override def reset(): Unit = total.reset()
  override def add(v: ProbeCounters): Unit = total.add(v)
  override def merge(other: AccumulatorV2[ProbeCounters, ProbeCounters]): Unit = total.add(other.value)
  override def value: ProbeCounters = total
}

/**
 * The probe routes of streaming UMJoins, kept on the driver across micro-batches (per query run
 * and operator; a restart begins again from the plan's routes). With an adaptive policy, before
 * each batch runs the previous batch's counters become one cycle of statistics, and once
 * `periodMs` has passed since the last choice the policy chooses every stream's route again from
 * the forecast; with the fixed order the plan's routes stay.
 */
object StreamingRoutes extends Logging {

  private final class Entry(var routes: Map[Int, ProbeRoute], val history: StatisticsHistory, var chosenAtMs: Long,
      var pending: Option[ProbeCountersAccumulator], var usedAtMs: Long)

  /** An operator unseen for this long has stopped; its statistics are dropped (were it to run again, it starts afresh). */
  private val IdleMs = 60L * 60 * 1000

  private val entries = TrieMap[(UUID, Long), Entry]()

  /**
   * The routes the next micro-batch of operator `operatorId` in run `runId` probes with, and how many
   * of them changed; `planned` are the plan's routes, one per start input, along `graph`'s edges.
   * Key counts are per partition: a probe reads one partition's store.
   */
  def next(runId: UUID, operatorId: Long, graph: ProbeGraph, planned: Map[Int, ProbeRoute], settings: ProbeOrderSettings,
      cost: CostModel, partitions: Int): (Map[Int, ProbeRoute], Int) = {
    val starts = planned.keys.toSeq.sorted
    val now = System.currentTimeMillis()
    entries.filterInPlace { case (_, e) => now - e.usedAtMs < IdleMs }
    val entry = entries.getOrElseUpdate((runId, operatorId), new Entry(planned, new StatisticsHistory(settings.history), now, None, now))
    entry.synchronized {
      entry.usedAtMs = now
      entry.pending.foreach { accumulator =>
        val counters = accumulator.value
        if (!counters.isEmpty) entry.history.add(counters.cycle(counters.stored.toIndexedSeq.map(_.toDouble / partitions)))
      }
      entry.pending = None
      if (settings.adaptive && !entry.history.isEmpty && now - entry.chosenAtMs >= settings.periodMs) {
        val forecast = entry.history.forecast(settings.smoothing)
        val routes = settings.policy.routes(graph, forecast, cost, starts)
        logDebug(s"UMJoin ${settings.policy.name} (operator $operatorId): routes ${routes.values.map(_.order.mkString("->")).mkString(", ")} " +
          s"from gamma ${forecast.matchRate}, mu ${forecast.matchesPerSuccess}, kappa ${forecast.keys}")
        val changed = starts.count(s => routes(s) != entry.routes(s))
        entry.routes = routes
        entry.chosenAtMs = now
        (routes, changed)
      } else (entry.routes, 0)
    }
  }

  /** The counters the micro-batch now running fills, read when the next one is planned. */
  def collect(runId: UUID, operatorId: Long, accumulator: ProbeCountersAccumulator): Unit =
    entries.get((runId, operatorId)).foreach(e => e.synchronized { e.pending = Some(accumulator) })
}
