package umjoin.spark.core.probe

import org.apache.spark.{TaskContext, TaskKilledException}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{And, Attribute, BasePredicate, Expression,
  GenericInternalRow, UnsafeProjection}
import org.apache.spark.sql.execution.metric.SQLMetric

import umjoin.spark.core.GeneratedCode
import umjoin.spark.core.cost.ProbeCounters
import umjoin.spark.core.store.JoinStore

/**
 * Counters of one input, shown as SQL metrics of the UMJoin node (`nullPadded`: an outer join's
 * non-preserved side's).
 */
final case class InputMetrics(rowsIn: SQLMetric, probes: SQLMetric, matches: SQLMetric,
    earlyStops: SQLMetric, storeSize: SQLMetric, nullPadded: Option[SQLMetric] = None,
    conditionChecks: Option[SQLMetric] = None, costlyChecks: Option[SQLMetric] = None)

/**
 * The names of input i's counters: the same in batch (SQL metrics) and in streaming (the progress's
 * custom metrics).
 */
object InputMetrics {
  def rowsIn(i: Int): String = s"rowsInInput$i"
  def probes(i: Int): String = s"probesInput$i"
  def matches(i: Int): String = s"matchesInput$i"
  def earlyStops(i: Int): String = s"earlyStopsInput$i"
  def nullPadded(i: Int): String = s"nullPaddedInput$i"
  def conditionChecks(i: Int): String = s"conditionChecksInput$i"
  def costlyChecks(i: Int): String = s"costlyConditionChecksInput$i"
}

/**
 * A route (or some of its steps) ready to run: its steps, the conditions on the streamed row alone
 * (null: none), the condition a complete combination must meet to come out (null: none), the
 * output projection, and how many fields a streamed row has (the route's start's, or those of the
 * partial combination it goes on from).
 */
final class CompiledRoute(val steps: Array[CompiledRoute.Step],
    val streamedCondition: BasePredicate, val output: UnsafeProjection,
    val resultCondition: BasePredicate, val streamedWidth: Int)

object CompiledRoute {

  /**
   * One step of a probe route: the store probed (`input`'s index on the step's key class), the key
   * computed from the rows bound so far, the conditions checked once this input's row is bound
   * (null: none; those that cannot fail in `condition`, then the others, such as a costly UDF, in
   * `costly`, whose tests are counted apart: a predicate's calls), and `from`, the route's edge
   * source the statistics are kept for. `rule` says what a match
   * and its absence do ([[StepRule]]); an outer step binds each row satisfying `condition` (its ON
   * clause), or `nullRow` when none does, and lets the combination go on where `post` holds (null:
   * always). With `unmatched` (a streaming UMJoin's semi step: a later row may still match), a
   * combination none matches is handed to it instead of being dropped. A streaming UMJoin's outer
   * step pads only where no row of `padCheck` (null: none) satisfies the ON clause either (its
   * `store` holds only the rows this route may bind, `padCheck` the input's other rows) and
   * `padNow` holds for the combination (null: always): the watermark rules out a later match. With
   * `firstMatchDecides` (see [[Route.Step]]) the first matching row ends the probe.
   */
  final class Step(val input: Int,
      val from: Int, val store: JoinStore, val probeKey: UnsafeProjection, condition: BasePredicate,
      costly: BasePredicate, val metrics: InputMetrics, rule: StepRule, val post: BasePredicate,
      val nullRow: InternalRow, val unmatched: InternalRow => Unit, val padCheck: JoinStore = null,
      val padNow: BasePredicate = null, val firstMatchDecides: Boolean = false) {
    // The rule's answers as fields: read for every probe.
    val firstMatchOnly: Boolean = rule.firstMatchOnly
    val goesOnMatched: Boolean = rule.goesOnMatched
    val goesOnAsIs: Boolean = rule.noMatch == StepRule.GoesOnAsIs
    val padded: Boolean = rule.noMatch == StepRule.Padded
    val emptyStoreEndsAll: Boolean = rule.emptyStoreEndsAll
    private val checks: SQLMetric = metrics.conditionChecks.orNull
    private val costlyChecks: SQLMetric = metrics.costlyChecks.orNull

    /**
     * Whether `row` (the combination and a row of this input) meets the step's conditions; each
     * test counted where counted.
     */
    def holds(row: InternalRow): Boolean = (condition == null && costly == null) || {
      if (checks != null) checks += 1
      (condition == null || condition.eval(row)) && (costly == null || {
        if (costlyChecks != null) costlyChecks += 1
        costly.eval(row)
      })
    }
  }

  /**
   * Compiles a route's steps within a task. `storeOf(input, index)` is the store probed through
   * that index; `keyed` turns probe keys into the form the stores are keyed by.
   */
  def apply(
      plan: Route.Plan,
      outputs: Seq[Seq[Attribute]],
      result: Seq[Attribute],
      storeOf: (Int, StoreIndex) => JoinStore,
      keyed: Seq[Expression] => Seq[Expression],
      metrics: Seq[InputMetrics],
      partition: Int): CompiledRoute =
    segment(plan, 0, plan.steps.size, outputs, result, storeOf, keyed, metrics, partition)

  /**
   * Compiles steps [from, until) of a route: the rows it starts from are the route's first
   * `from + 1` inputs joined (the start row alone for `from` 0, whose own conditions are checked
   * first), and it puts out the `result` projection once the route is complete, else the rows
   * bound so far, joined (a partial combination that continues elsewhere). With `unmatched`, a semi
   * step hands a combination none of its rows matches to `unmatched(its input, the combination's
   * attributes)`. With `padding`, an outer step pads as [[Step]] says, with `padding.check(input,
   * index)` and `padding.now(input)`; a complete combination comes out where `padding.result`
   * holds.
   */
  def segment(
      plan: Route.Plan,
      from: Int,
      until: Int,
      boundOutputs: Seq[Seq[Attribute]],
      result: Seq[Attribute],
      storeOf: (Int, StoreIndex) => JoinStore,
      keyed: Seq[Expression] => Seq[Expression],
      metrics: Seq[InputMetrics],
      partition: Int,
      unmatched: Option[(Int, Seq[Attribute]) => InternalRow => Unit] = None,
      padding: Option[StreamPadding] = None): CompiledRoute = {
    val order = plan.route.order
    // An outer step's input may be bound as a row of NULLs: its columns are read as nullable.
    val padded = plan.steps.filter(_.rule == StepRule.Outer).map(_.input).toSet
    val outputs = boundOutputs.indices.map(i =>
      if (padded.contains(i)) boundOutputs(i).map(_.withNullability(true)) else boundOutputs(i))
    val binds =
      plan.steps.map(_.input).zip(plan.steps.map(_.rule.binds)).toMap.withDefaultValue(true)
    // prefixes(p): the attributes of the rows bound once the route's first p + 1 inputs are (a
    // filter binds none).
    val prefixes = order.indices.map(p => order.take(p + 1).filter(binds).flatMap(outputs))
    def predicate(conditions: Seq[Expression], attrs: Seq[Attribute]): BasePredicate =
      conditions.reduceOption(And).map(GeneratedCode.predicate(_, attrs, partition)).orNull
    val steps = (from until until).map { s =>
      val step = plan.steps(s)
      val attrs = prefixes(s) ++ outputs(step.input)
      val (cheap, costly) = step.conditions.partition(ConditionOrder.cannotFail)
      new CompiledRoute.Step(step.input, step.from, storeOf(step.input, step.index),
        GeneratedCode.projection(keyed(step.probeKeys), prefixes(s)),
        predicate(cheap, attrs), predicate(costly, attrs), metrics(step.input), step.rule,
        predicate(step.postConditions, attrs), new GenericInternalRow(outputs(step.input).size),
        if (step.rule == StepRule.Semi) unmatched.map(_(step.input, prefixes(s))).orNull else null,
        padding.filter(_ => step.rule == StepRule.Outer)
          .map(_.check(step.input, step.index)).orNull,
        padding.filter(_ => step.rule == StepRule.Outer).flatMap(_.now(step.input))
          .map(GeneratedCode.interpreted(_, prefixes(s), partition)).orNull,
        step.firstMatchDecides)
    }.toArray
    // A rescan's conditions hold the micro-batch's watermark: interpreted, as they would be new
    // code in every batch.
    val rescan = padding.flatMap(_.start)
    val startCondition =
      if (from > 0) null
      else if (rescan.isDefined) GeneratedCode.interpreted((plan.startConditions ++ rescan)
        .reduce(And), outputs(order.head), partition)
      else predicate(plan.startConditions, outputs(order.head))
    val complete = until == plan.steps.size
    val output = if (complete) result else prefixes(until)
    val resultCondition = padding.flatMap(_.result).filter(_ => complete)
      .map(GeneratedCode.interpreted(_, prefixes(until), partition)).orNull
    new CompiledRoute(steps, startCondition, GeneratedCode.projection(output, prefixes(until)),
      resultCondition, prefixes(from).size)
  }
}

/**
 * How a streaming UMJoin's outer steps pad (see [[CompiledRoute.Step]]): `check(input, index)` is
 * the outer input's rows the route does not bind (null: none), `now(input)` the condition (over the
 * preserved inputs' columns) under which the watermark rules out a later match. `start` and
 * `result`, where given, are conditions on the start row and on a complete combination (the rescan
 * of stored rows: see `StageTask`).
 */
final case class StreamPadding(check: (Int, StoreIndex) => JoinStore,
    now: Int => Option[Expression],
    start: Option[Expression] = None, result: Option[Expression] = None)

/**
 * Chooses the route again now and then, within a task (the adaptive probe-order policies in batch).
 */
trait Rerouting {
  /** Streamed rows between two choices. */
  def cycleRows: Long
  /** The route for the next cycle, if it changed. */
  def next(): Option[CompiledRoute]
}

/**
 * Iterative probing (UMJoin paper 000, 3.1.1): each streamed row probes the stores in probe order;
 * every match is joined to the rows bound so far and probes the next store; a probe without a match
 * ends that branch at once (early termination). Emits the output of every complete combination,
 * lazily. With `statistics`, every probe's outcome is counted (for the adaptive probe-order
 * policies). With `rerouting`, the route may change every cycle, always between two streamed rows:
 * a row's combinations all come from one route, and every route computes the same join.
 * `streamedRows` counts the rows taken in (not where they are partial combinations from an earlier
 * task), `numOutputRows` the rows put out (not where they are partial combinations going on
 * elsewhere).
 *
 * The iterator `join` returns may be asked again after it ran dry: it goes on with whatever the
 * streamed iterator has by then (a streaming task feeds it one partial combination at a time).
 */
final class ProbeCore(
    initial: CompiledRoute,
    streamedRows: Option[SQLMetric],
    numOutputRows: Option[SQLMetric],
    context: TaskContext,
    statistics: Option[ProbeCounters] = None,
    rerouting: Option[Rerouting] = None) {

  def join(streamed: Iterator[InternalRow]): Iterator[InternalRow] =
    if (initial.steps.exists(s => s.store.isEmpty && s.emptyStoreEndsAll))
      Iterator.empty else new Combinations(streamed)

  private final class Combinations(streamed: Iterator[InternalRow]) extends Iterator[InternalRow] {
    private var route = initial
    private val depth = route.steps.length
    // slots(0): the streamed row; slots(k + 1): step k's row (a stored one, or NULLs). checked(k):
    // the rows bound before step k and its row, read as one (step k's conditions); bound(k): the
    // rows bound before step k (the streamed row for k 0).
    private val slots = new Array[InternalRow](depth + 1)
    private var checked = rowsOf(route)
    private val bound = new Array[InternalRow](depth + 1)
    private val candidates = new Array[Iterator[InternalRow]](depth)
    private val found = new Array[Long](depth)
    // Per outer step: whether a stored row satisfied its ON clause for the current combination.
    private val anyMatch = new Array[Boolean](depth)
    // The step whose candidates are tried next; -1: take the next streamed row.
    private var level = -1
    private var ready = false
    private var work = 0L
    private var rowsInCycle = 0L
    private val counters = statistics.orNull

    override def hasNext: Boolean = ready || advance()

    override def next(): InternalRow = {
      if (!hasNext) throw new NoSuchElementException("no more UMJoin rows")
      ready = false
      numOutputRows.foreach(_ += 1)
      route.output(bound(depth))
    }

    /** Finds the next complete combination; false when the streamed input is exhausted. */
    private def advance(): Boolean = {
      while (true) {
        work += 1
        if ((work & 0xfff) == 0 && context.isInterrupted())
          throw new TaskKilledException("UMJoin task cancelled")
        if (level < 0) {
          if (!streamed.hasNext) return false
          rerouting.foreach { r =>
            rowsInCycle += 1
            if (rowsInCycle > r.cycleRows) {
              rowsInCycle = 1
              r.next().foreach { next =>
                route = next
                checked = rowsOf(next)
              }
            }
          }
          val row = streamed.next()
          streamedRows.foreach(_ += 1)
          if (route.streamedCondition == null || route.streamedCondition.eval(row)) {
            bound(0) = row
            slots(0) = row
            if (depth == 0) { // no step to take here: the row itself is what comes out
              ready = true
              return true
            }
            probe(0)
            level = 0
          }
        } else if (nextMatch(level)) {
          if (level == depth - 1) {
            if (route.resultCondition == null || route.resultCondition.eval(bound(depth))) {
              ready = true
              return true
            }
          } else {
            level += 1
            probe(level)
          }
        } else {
          val step = route.steps(level)
          if (found(level) == 0) step.metrics.earlyStops += 1
          if (counters != null) counters.record(step.from, step.input, found(level))
          level -= 1
        }
      }
      false
    }

    private def rowsOf(route: CompiledRoute): Array[BoundRows] =
      BoundRows.perStep(slots, route.streamedWidth +: route.steps.map(_.nullRow.numFields),
        route.steps.toSeq.map(!_.firstMatchOnly))

    /** Checks step k's conditions with `row` of its input in its slot. */
    private def holdsWith(k: Int, row: InternalRow): Boolean = {
      slots(k + 1) = row
      route.steps(k).holds(checked(k))
    }

    /**
     * Whether a row of step k's input this route does not bind satisfies its ON clause for the
     * combination.
     */
    private def matchedElsewhere(k: Int): Boolean = {
      val step = route.steps(k)
      val key = step.probeKey(bound(k))
      !key.anyNull && step.padCheck.get(key).exists(holdsWith(k, _))
    }

    /** Starts step k: probes its store with the key of the rows bound so far. */
    private def probe(k: Int): Unit = {
      val step = route.steps(k)
      step.metrics.probes += 1
      val key = step.probeKey(bound(k))
      candidates(k) = if (key.anyNull) Iterator.empty else step.store.get(key)
      found(k) = 0
      anyMatch(k) = false
    }

    /**
     * Binds the next stored row of step k that satisfies its conditions, as its [[StepRule]] says:
     * a step that stops at its first match (semi, anti) lets the combination go on at most once,
     * binding nothing; a binding step (inner, outer) binds each such row in turn, and an outer one,
     * once its rows ran out without one satisfying its ON clause, a row of NULLs.
     */
    private def nextMatch(k: Int): Boolean = {
      val step = route.steps(k)
      if (step.firstMatchOnly) {
        if (candidates(k) == null) return false  // this combination went on already
        var matched = false
        while (!matched && candidates(k).hasNext) matched = holdsWith(k, candidates(k).next())
        candidates(k) = null
        if (matched) step.metrics.matches += 1
        else if (step.unmatched != null) step.unmatched(bound(k))
        val goesOn = if (matched) step.goesOnMatched else step.goesOnAsIs
        if (goesOn) {
          found(k) += 1
          bound(k + 1) = bound(k)
        }
        return goesOn
      }
      while (candidates(k) != null && candidates(k).hasNext) {
        if (holdsWith(k, candidates(k).next())) {
          val row = checked(k)
          step.metrics.matches += 1
          anyMatch(k) = true
          // no other match would pass `post` either
          if (step.firstMatchDecides) candidates(k) = null
          else if (step.post == null || step.post.eval(row)) {
            found(k) += 1
            bound(k + 1) = row
            return true
          }
        }
      }
      if (!step.padded || candidates(k) == null || anyMatch(k)) return false
      candidates(k) = null  // the NULL row is bound once
      if (step.padCheck != null && matchedElsewhere(k)) return false
      if (step.padNow != null && !step.padNow.eval(bound(k))) return false
      step.metrics.nullPadded.foreach(_ += 1)
      slots(k + 1) = step.nullRow
      val row = checked(k)
      if (step.post == null || step.post.eval(row)) {
        found(k) += 1
        bound(k + 1) = row
        return true
      }
      false
    }
  }
}
