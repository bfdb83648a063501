package umjoin.spark.streaming

import org.apache.spark.util.AccumulatorV2

import umjoin.spark.core.cost.{AdaptiveRouter, CostModel, ProbeCounters, ProbeGraph,
  ProbeOrderSettings}
import umjoin.spark.core.probe.Route

/** Sums the tasks' probe counters of one micro-batch, for the driver. */
final class ProbeCountersAccumulator(inputs: Int)
  extends AccumulatorV2[ProbeCounters, ProbeCounters] {
  private val total = new ProbeCounters(inputs)
  override def isZero: Boolean = total.isEmpty && total.stored.forall(_ == 0)
  override def copy(): ProbeCountersAccumulator = {
    val c = new ProbeCountersAccumulator(inputs)
    c.total.add(total)
    c
  }
  override def reset(): Unit = total.reset()
  override def add(v: ProbeCounters): Unit = total.add(v)
  override def merge(other: AccumulatorV2[ProbeCounters, ProbeCounters]): Unit =
    total.add(other.value)
  override def value: ProbeCounters = total
}

/**
 * The probe routes of streaming UMJoins, kept on the driver across micro-batches in their query
 * run's [[StreamingRun]] (per operator; a restart begins again from the plan's routes).
 * With an adaptive policy, before each batch runs the previous batch's counters become one cycle of
 * statistics, and once `periodMs` has passed since the last choice the policy chooses every
 * stream's route again from the forecast; with the fixed order the plan's routes stay.
 */
object StreamingRoutes {

  /** One operator's router, when it chose last, and the counters of the micro-batch running. */
  final class Entry(val router: AdaptiveRouter, var chosenAtMs: Long,
      var pending: Option[ProbeCountersAccumulator])

  /**
   * The routes the next micro-batch of operator `operatorId` probes with, and how many of them
   * changed; `planned` are the plan's routes, one per start input, along `graph`'s edges. Key
   * counts are per partition: a probe reads one partition's store.
   */
  def next(run: StreamingRun,
      operatorId: Long, graph: ProbeGraph, planned: Map[Int, Route], settings: ProbeOrderSettings,
      cost: CostModel, partitions: Int): (Map[Int, Route], Int) = {
    val now = System.currentTimeMillis()
    val entry = run.routes.getOrElseUpdate(operatorId,
      new Entry(new AdaptiveRouter(settings, graph, cost, planned), now, None))
    entry.synchronized {
      entry.pending.foreach { accumulator =>
        val counters = accumulator.value
        if (!counters.isEmpty)
          entry.router.record(counters, counters.stored.toIndexedSeq.map(_.toDouble / partitions))
      }
      entry.pending = None
      if (settings.adaptive && entry.router.hasStatistics &&
          now - entry.chosenAtMs >= settings.periodMs) {
        val changed = entry.router.choose().size
        entry.chosenAtMs = now
        (entry.router.routes, changed)
      } else (entry.router.routes, 0)
    }
  }

  /** The counters the micro-batch now running fills, read when the next one is planned. */
  def collect(run: StreamingRun, operatorId: Long,
      accumulator: ProbeCountersAccumulator): Unit =
    run.routes.get(operatorId).foreach(e => e.synchronized { e.pending = Some(accumulator) })
}
