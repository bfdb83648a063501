package umjoin.spark.exec

import org.apache.spark.{TaskContext, TaskKilledException}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{BasePredicate, JoinedRow, UnsafeProjection}
import org.apache.spark.sql.execution.metric.SQLMetric

import umjoin.spark.state.JoinStore

/** Counters of one input, shown as SQL metrics of the UMJoin node. */
final case class InputMetrics(rowsIn: SQLMetric, probes: SQLMetric, matches: SQLMetric, earlyStops: SQLMetric, storeSize: SQLMetric)

/**
 * One step of the probe order after the streamed input: the store probed, the key computed from
 * the rows bound so far, and the conditions checked once this input's row is bound (null: none).
 */
final class ProbeStep(val store: JoinStore, val probeKey: UnsafeProjection, val condition: BasePredicate, val metrics: InputMetrics)

/**
 * Iterative probing (paper 000, 3.1.1): each streamed row probes the stores in probe order; every
 * match is joined to the rows bound so far and probes the next store; a probe without a match ends
 * that branch at once (early termination). Emits `output` of every complete combination, lazily.
 *
 * @param streamedCondition conditions on the streamed row alone (null: none)
 * @param output            projects the rows bound in probe order (joined left to right) to the output
 * @param context           the task, checked now and then so a cancelled query stops probing
 */
final class ProbeCore(
    steps: Array[ProbeStep],
    streamedCondition: BasePredicate,
    streamedMetrics: InputMetrics,
    output: UnsafeProjection,
    numOutputRows: SQLMetric,
    context: TaskContext) {

  def join(streamed: Iterator[InternalRow]): Iterator[InternalRow] =
    if (steps.exists(_.store.isEmpty)) Iterator.empty else new Combinations(streamed)

  private final class Combinations(streamed: Iterator[InternalRow]) extends Iterator[InternalRow] {
    private val depth = steps.length
    // bound(k): the rows bound through step k, joined; bound(0) is the streamed row alone.
    private val bound = new Array[InternalRow](depth + 1)
    private val joined = Array.fill(depth)(new JoinedRow)
    private val candidates = new Array[Iterator[InternalRow]](depth)
    private val matchedAny = new Array[Boolean](depth)
    // The step whose candidates are tried next; -1: take the next streamed row.
    private var level = -1
    private var ready = false
    private var work = 0L

    override def hasNext: Boolean = ready || advance()

    override def next(): InternalRow = {
      if (!hasNext) throw new NoSuchElementException("no more UMJoin rows")
      ready = false
      numOutputRows += 1
      output(bound(depth))
    }

    /** Finds the next complete combination; false when the streamed input is exhausted. */
    private def advance(): Boolean = {
      while (true) {
        work += 1
        if ((work & 0xfff) == 0 && context.isInterrupted()) throw new TaskKilledException("UMJoin task cancelled")
        if (level < 0) {
          if (!streamed.hasNext) return false
          val row = streamed.next()
          streamedMetrics.rowsIn += 1
          if (streamedCondition == null || streamedCondition.eval(row)) {
            bound(0) = row
            probe(0)
            level = 0
          }
        } else if (nextMatch(level)) {
          if (level == depth - 1) {
            ready = true
            return true
          }
          level += 1
          probe(level)
        } else {
          if (!matchedAny(level)) steps(level).metrics.earlyStops += 1
          level -= 1
        }
      }
      false
    }

    /** Starts step k: probes its store with the key of the rows bound so far. */
    private def probe(k: Int): Unit = {
      val step = steps(k)
      step.metrics.probes += 1
      val key = step.probeKey(bound(k))
      candidates(k) = if (key.anyNull) Iterator.empty else step.store.get(key)
      matchedAny(k) = false
    }

    /** Binds the next stored row of step k that satisfies its conditions. */
    private def nextMatch(k: Int): Boolean = {
      val step = steps(k)
      while (candidates(k).hasNext) {
        val row = joined(k)(bound(k), candidates(k).next())
        if (step.condition == null || step.condition.eval(row)) {
          step.metrics.matches += 1
          matchedAny(k) = true
          bound(k + 1) = row
          return true
        }
      }
      false
    }
  }
}
