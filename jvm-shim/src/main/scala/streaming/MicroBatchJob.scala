package umjoin.spark.streaming

import org.apache.spark.sql.catalyst.expressions.{And, Attribute, Expression, Not, Or}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo

import umjoin.spark.core.JoinGraph
import umjoin.spark.core.probe.{Route, StoreIndex}

/**
 * A semi join's combinations of its preserved inputs that no row of its non-preserved input
 * `nonPreserved` matched yet: kept in `spec`'s store (rows: the preserved inputs' columns, in
 * input order), partitioned as `nonPreserved`'s store is, by the combination's value of the join's
 * key class.
 *
 * @param onCondition the rest of the join's condition, over a combination's columns and then
 *                    `nonPreserved`'s
 * @param unmatchable the combinations no later row of `nonPreserved` can match (None: no watermark
 *                    yet); they are dropped
 */
final case class UnmatchedSpec(nonPreserved: Int, spec: InputStateSpec,
    onCondition: Option[Expression], unmatchable: Option[Expression])

object UnmatchedSpec {
  /**
   * Where a partition keeps the combinations waiting for each semi join's first match, lowest join
   * first; `unmatchable` per input.
   */
  def of(graph: JoinGraph, outputs: IndexedSeq[Seq[Attribute]],
      unmatchable: Seq[Option[Expression]]): Seq[UnmatchedSpec] =
    graph.filters.keys.toSeq.sorted.map { o =>
      val key = graph.classes.indexWhere(_.inputs.contains(o))
      val preserved = graph.joined.filter(_ != o)
      // A waiting combination may be padded for an outer input: its columns are read as nullable.
      val columns = preserved.flatMap(i =>
        if (graph.outer.contains(i)) outputs(i).map(_.withNullability(true)) else outputs(i))
      UnmatchedSpec(o,
        InputStateSpec(o, columns, key, graph.classes(key).members
          .collectFirst { case (i, e) if graph.joined.contains(i) => e }.get, Nil,
          InputState.unmatchedStoreName(o)),
        graph.residuals.filter(_.inputs.contains(o)).map(_.condition).reduceOption(And),
        unmatchable(o))
    }
}

/**
 * When the group's outer joins put out a combination of their preserved inputs padded with NULLs:
 * in the batch its formation, its matched rows' arrivals and, for every input it is padded for, the
 * first batch in which that join's state watermark ruled out a later match, whichever is latest,
 * as Spark's chain of outer joins puts it out. Conditions are over the columns of the preserved
 * inputs (`now(o)` and `before(o)`: outer input o's join rules it out in this batch, and did in the
 * one before; Spark's state watermark predicate of the join's preserved side, which reads stream
 * `starts(o)` only); `padded(o)`: a result row's columns of o are NULLs. Combinations none of whose
 * rows is new come out by the rescan of each start's stored rows: see [[StageTask]].
 */
final case class OuterPadding(starts: Map[Int, Int], now: Map[Int, Expression],
    before: Map[Int, Expression], padded: Map[Int, Expression]) {
  /**
   * The streams whose stored rows are rescanned, in the order their rescans claim a combination due
   * by several.
   */
  val rescanStarts: Seq[Int] = starts.values.toSeq.distinct.sorted

  private def joinsOf(start: Int): Seq[Int] = starts.keys.toSeq.sorted.filter(starts(_) == start)
  /**
   * A stored row of `starts(o)` that o's join rules out now, not before: its combinations may be
   * due.
   */
  def newly(o: Int): Expression = And(now(o), Not(before(o)))
  /** A stored row of `start` some join evicted by its event time rules out just now. */
  def rescanned(start: Int): Expression = joinsOf(start).map(newly).reduce(Or)
  private def dueBy(start: Int): Expression =
    joinsOf(start).map(o => And(padded(o), newly(o))).reduce(Or)
  /**
   * A complete combination the rescan of `start` puts out: padded for some input whose join ruled
   * it out just now by `start`'s time, and by none an earlier start's rescan answers for (it puts
   * it out once).
   */
  def due(start: Int): Expression =
    rescanStarts.takeWhile(_ != start).map(dueBy)
      .foldLeft(dueBy(start))((due, earlier) => And(due, Not(earlier)))
}

/**
 * What every task of one micro-batch of a streaming UMJoin needs (it travels with them): the
 * operator's description (`spec`, and its expressions bound to the layout chosen) and what the
 * operator decided for this batch.
 *
 * @param routes     per stream that starts one, the route this batch's new rows take
 * @param staticLoads per stored static table, whether this batch writes its stores, and which load
 *                   they hold
 * @param nowMs      the batch's time, the same in every task and retry (stored rows' time, TTL)
 */
final case class MicroBatchJob(
    spec: GroupSpec,
    layout: StreamingLayout,
    graph: JoinGraph,
    outputs: IndexedSeq[Seq[Attribute]],
    result: Seq[Attribute],
    lateRows: IndexedSeq[Option[Expression]],
    evictable: IndexedSeq[Option[Expression]],
    unmatched: Seq[UnmatchedSpec],
    padding: Option[OuterPadding],
    routes: Map[Int, Route.Plan],
    staticLoads: Map[Int, StaticVersions.Decision],
    nowMs: Long,
    info: StatefulOperatorStateInfo) {

  /** Per stored input, where a partition keeps its rows. */
  @transient lazy val states: Map[Int, InputStateSpec] = InputStateSpec.of(layout, graph, outputs)

  /**
   * Per input, the keys a row with a NULL in one is dropped for: it joins nothing (not those of an
   * outer join preserving the input, which pads such a row).
   */
  @transient lazy val keysRejectingNull: IndexedSeq[Seq[Expression]] =
    layout.kinds.indices.map(graph.keysRejectingNull)

  /** Per stream spread by time slice, which of its partitions a combination is sent to. */
  @transient lazy val slices: Map[Int, SliceWindow] =
    layout.kinds.indices.filter(layout.isTimeSliced).map(j => j ->
      SliceWindow(layout.timeSlices(j).get, info.numPartitions, spec.sliceBounds(j))).toMap

  /**
   * Per stored static table, its rows' and the rows probing it estimated bytes (v_R and v_S of
   * paper 003, SSBJ, Theorem 2), v_S averaged over the routes' steps into it.
   */
  @transient lazy val staticRowBytes: Map[Int, (Double, Double)] = staticLoads.keys.map { j =>
    val probing = routes.values.toSeq.flatMap(run => run.route.order.indexOf(j) match {
      case p if p > 0 => Some(MicroBatchJob.rowBytes(run.route.order.take(p).flatMap(outputs)))
      case _ => None
    })
    j -> (MicroBatchJob.rowBytes(outputs(j)),
      if (probing.isEmpty) 1.0 else probing.sum / probing.size)
  }.toMap

  /** How the rows shipped between this job's stages say what they are. */
  @transient lazy val shippedTags: Shipped.Tags = new Shipped.Tags(layout.kinds.size)

  /** The route a partial combination continues (a rescan takes the steps of its start's route). */
  def planOf(partial: Shipped.Partial): Route.Plan = routes(partial.start)

  /**
   * The inputs whose rows a partial combination holds once its route's first `n` inputs are
   * probed (a semi join's binds none).
   */
  def boundBy(partial: Shipped.Partial, n: Int): Seq[Int] = {
    val run = planOf(partial)
    run.route.order.take(n)
      .filter(i => run.steps.forall(step => step.input != i || step.rule.binds))
  }

  /** Stages the routes need: one per segment of the longest. */
  private def routeStages: Int = routes.values.map(_.segments.size).max

  /**
   * Per semi join (`unmatched`'s order), the stage that settles its waiting combinations: the
   * routes' last, and one more after each change of key (a combination one semi join lets through
   * goes on to the next one's partition: that join's stores are partitioned by its key).
   */
  val settleStage: IndexedSeq[Int] = unmatched.indices.scanLeft(routeStages - 1) { (stage, k) =>
    if (k > 0 && unmatched(k).spec.partitionClass !=
        unmatched(k - 1).spec.partitionClass) stage + 1 else stage
  }.tail

  /**
   * Tasks in a row the routes and the semi joins' settling need; each stage's task k works on
   * partition k of every store.
   */
  val stageCount: Int = settleStage.lastOption.fold(routeStages)(_ + 1)

  /**
   * Whether input j is a stored static table this batch writes (so its rows come from its child,
   * not its stores).
   */
  def loads(j: Int): Boolean = staticLoads.get(j).exists(_.load)

  /**
   * The steps (route's start, input probed, index probed through) the routes take in stage
   * `stage`.
   */
  def probesIn(stage: Int): Seq[(Int, Int, StoreIndex)] = routes.values.toSeq.flatMap { run =>
    run.segments.lift(stage).toSeq.flatMap(seg =>
      (seg.from until seg.until).map(t => (run.start, run.steps(t).input, run.steps(t).index)))
  }

  /** The input's expression for key class `c`. */
  def keyOf(input: Int, c: Int): Expression = graph.classes(c).keyOf(input).get
}

object MicroBatchJob {
  /** A row's bytes as Spark estimates them from its schema. */
  def rowBytes(attributes: Seq[Attribute]): Double =
    attributes.map(_.dataType.defaultSize).sum.max(1).toDouble
}
