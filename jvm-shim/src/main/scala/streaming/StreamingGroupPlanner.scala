package umjoin.spark.streaming

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path

import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.expressions.{Alias, And, Attribute, AttributeSet, Coalesce,
  EqualTo, ExprId, Expression, Literal, NamedExpression, Not, Or, PredicateHelper}
import org.apache.spark.sql.catalyst.plans.logical.EventTimeWatermark
import org.apache.spark.sql.catalyst.plans.{FullOuter, Inner, LeftOuter, LeftSemi, RightOuter}
import org.apache.spark.sql.catalyst.plans.physical.IdentityBroadcastMode
import org.apache.spark.sql.execution.{FileSourceScanExec, FilterExec, PlanLater, ProjectExec,
  SparkPlan}
import org.apache.spark.sql.execution.datasources.{HadoopFsRelation, LogicalRelation}
import org.apache.spark.sql.execution.exchange.BroadcastExchangeExec
import org.apache.spark.sql.execution.joins.BaseJoinExec
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperatorStateInfo,
  WatermarkSupport}
import org.apache.spark.sql.execution.streaming.operators.stateful.join.
  StreamingSymmetricHashJoinHelper
import org.apache.spark.sql.types.{StructField, StructType}

import umjoin.spark.UMJoinConf
import umjoin.spark.core.{FilterJoin, GroupSplitting, JoinGraph, OuterJoin, ResidualCondition}
import umjoin.spark.core.cost.{JoinSizes, ProbeOrderPolicy}
import umjoin.spark.core.tsc.{MemberPatterns, MultiJoinGroup, PhysicalPatterns, StreamJoin,
  TwoStepConvert}

/**
 * A streaming group as planned: its StreamingUMJoin over the group's inputs as they stood when it
 * was planned, to be given them once planned ([[StreamingGroupPlanner]]'s `build`). `marks` are the
 * columns each input's rows carry for the late filters over partial combinations (see
 * [[StreamingWatermarks]]), whose conditions are among the graph's residuals. `project` computes
 * the group's output from the StreamingUMJoin's where projections of the group compute some of it.
 */
final case class StreamingGroupPlan(operator: StreamingUMJoinExec, marks: Seq[Seq[Alias]],
    project: Option[Seq[NamedExpression]])

/**
 * When the group's outer joins pad a combination (see [[OuterPadding]]): per outer input, the
 * condition under which its join's state watermark rules out a later match, in this micro-batch
 * (`now`) and in the one before (`before`), over the columns of stream `starts(o)`, the one whose
 * event time that watermark reads.
 */
final case class PaddingPlan(starts: Map[Int, Int], now: Map[Int, Expression],
    before: Map[Int, Expression])

/**
 * Plans the groups of a micro-batch's joins of streams ([[StreamingPlannerStrategy]] gives it the
 * joins as a tree of stand-ins over inputs still to be planned): TSC runs on that tree with the
 * member patterns of `rules/streaming.yaml`, and every group it can run exactly becomes one
 * StreamingUMJoin. A group's state layout (each input's partitioning key and indexes, the routes)
 * is read from the checkpoint; on a new checkpoint the operator chooses it by the probe-cost model
 * when it runs the first micro-batch ([[GroupLayout]]). What cannot be converted keeps Spark's
 * joins, and the reason is logged once per query run.
 */
final class StreamingGroupPlanner(session: SparkSession, patterns: MemberPatterns[SparkPlan])
  extends PredicateHelper with Logging {

  private val tsc = new TwoStepConvert[SparkPlan](patterns.roleOf, PhysicalPatterns.keptAsInput)

  /**
   * The groups of `tree`, a micro-batch's joins of streams as stand-ins over inputs still to be
   * planned (see [[StreamingPlannerStrategy]]); each group converted comes with its root, its
   * inputs and how to build its StreamingUMJoin over them once planned. `operatorOf` gives a group
   * its state (by its members); `reserved` is the state of every join's operator id, which the
   * groups' checkpoint is checked against on a run's first micro-batch (`firstOfRun`);
   * `takeOverFormat`, the join state format of Spark's joins whose state the groups take over,
   * where the checkpoint holds theirs.
   */
  def plannedGroups(tree: SparkPlan,
      operatorOf: Seq[SparkPlan] => Option[StatefulOperatorStateInfo],
      reserved: Seq[StatefulOperatorStateInfo], firstOfRun: Boolean,
      runId: java.util.UUID, inputWatermark: Option[Long], takeOverFormat: Option[Int])
      : Seq[(SparkPlan, Seq[SparkPlan], Seq[SparkPlan] => SparkPlan)] = {
    val conf = UMJoinConf.from(session.sessionState.conf)
    def unconverted(message: String): Unit =
      if (StreamingRun.of(session, runId).firstNote(message)) logInfo(s"UMJoin: $message")
    val mismatched = mutable.Map[Long, String]()
    val accepted = new GroupSplitting[SparkPlan, StreamingGroupPlan](tsc, patterns.roleOf,
      g => conf.minInputsOf(timeSliced(g)), tryPlan(_, conf, inputWatermark,
        operatorOf, firstOfRun, mismatched, takeOverFormat))
      .acceptedGroups(tree, (root, reason) => unconverted("the join group under " +
        s"${describe(root)} stays as Spark planned it: $reason${cutBy(tree, root)}"))
    // A stream-stream join no member pattern admits (a full outer join, say) roots no group: say
    // why it stays too.
    tree.foreach {
      case StreamJoin(j) if patterns.roleOf(j.node).isEmpty =>
        val why =
          if (j.joinType == FullOuter) " (both its sides are padded: a StreamingUMJoin pads one " +
            "side per outer join; alone, with join trees on its sides cut off, it would keep its " +
            "two inputs in state, as Spark's join does)"
          else ""
        unconverted(s"the ${describe(j)} stays as Spark planned it: rules/streaming.yaml " +
          s"admits no ${j.joinType.sql} stream-stream joins$why")
      case _ =>
    }
    if (firstOfRun) {
      val hadoopConf = session.sessionState.newHadoopConf()
      val converted = accepted.map(_._2.operator.getStateInfo.operatorId).toSet
      reserved.filter(_.storeVersion > 0).sortBy(s => converted(s.operatorId)).foreach(s =>
        checkOperatorState(s, converted(s.operatorId), mismatched, hadoopConf))
    }
    accepted.map { case (group, p) =>
      (group.root, group.inputs, (inputs: Seq[SparkPlan]) => build(group, p, inputs, conf))
    }
  }

  /**
   * A query restarted from a checkpoint keeps the state layout it was written with: a join tree's
   * state is either UMJoin's (one store per stream, under the group's operator id, with its layout
   * recorded beside it) or Spark's. Reading one as the other would fail obscurely, or worse; this
   * names the problem instead, for one operator's state: `isUMJoin`, whether a group this run
   * converts holds it; `mismatched`, why the groups tried did not fit an operator's recorded
   * layout.
   */
  private def checkOperatorState(info: StatefulOperatorStateInfo, isUMJoin: Boolean,
      mismatched: scala.collection.Map[Long, String], hadoopConf: Configuration): Unit = {
    val checkpoint = new OperatorCheckpoint(info, hadoopConf)
    val hasUMJoinState = checkpoint.hasUMJoinState
    if (isUMJoin && checkpoint.hasStoresWithoutLayout) {
      throw new IllegalStateException(s"The checkpoint ${info.checkpointLocation}" +
        s" holds StreamingUMJoin state for operator ${info.operatorId}" +
        (" written by an earlier version of UMJoin, whose state layout this version cannot " +
          "read. Use a new ") +
        s"checkpoint location, or finish the query with the UMJoin version that wrote it.")
    }
    if (isUMJoin && !hasUMJoinState && checkpoint.hasSparkJoinState) {
      throw new IllegalStateException(s"The checkpoint ${info.checkpointLocation}" +
        " holds Spark's stream-stream join state " + s"for operator ${info.operatorId}" +
        ", written without UMJoin; UMJoin cannot continue it. Restart with " +
        ("spark.umjoin.enabled=false, or use a new checkpoint location to run this query " +
          "with UMJoin."))
    }
    if (isUMJoin && !hasUMJoinState) {
      throw new IllegalStateException(s"The checkpoint ${info.checkpointLocation}" +
        s" has no state for operator ${info.operatorId} " +
        s"(no StreamingUMJoin layout record, ${checkpoint.layoutFile}" +
        s", and no state of Spark's join), although micro-batch ${info.storeVersion}" +
        (" continues a query that ran before: it was deleted or moved. Restore it, or use a " +
          "new checkpoint location."))
    }
    if (!isUMJoin && hasUMJoinState) {
      mismatched.get(info.operatorId)
        .foreach(refusal => throw new IllegalStateException(refusal))
      throw StreamingGroupPlanner.umjoinStateUnread(info.checkpointLocation, info.operatorId)
    }
  }

  /**
   * Where a projection no member pattern admits sits between `root` and a stream-stream join above
   * it, that projection, which cuts the join tree into groups: said with the reason a group stays.
   */
  private def cutBy(plan: SparkPlan, root: SparkPlan): String = {
    plan.collectFirst { case p if p.children.exists(_ eq root) => p } match {
      case Some(p: ProjectExec) if patterns.roleOf(p).isEmpty &&
          p.exists(StreamJoin.unapply(_).isDefined) &&
          plan.exists(j =>
            StreamJoin.unapply(j).isDefined && j.children.exists(_.exists(_ eq p))) =>
        val computed = p.projectList.filterNot(_.deterministic).map(_.sql)
        s"; the projection [${p.projectList.map(_.sql).mkString(", ")}" +
          "] above it cuts it from the stream-stream join above: " +
          (if (computed.nonEmpty) s"its columns ${computed.mkString(", ")}" +
            (" are not deterministic (a StreamingUMJoin would compute them once per result row, " +
              "not once per intermediate row)")
          else "rules/streaming.yaml admits no such projection into a join group")
      case _ => ""
    }
  }

  /**
   * A join as the reasons name it: its type and keys, e.g. `LEFT OUTER stream-stream join on x_k =
   * y_k` (without expression ids, which change from one micro-batch to the next: a reason is told
   * once).
   */
  private def describe(join: StreamJoin): String = describe(join.node)

  private def describe(node: SparkPlan): String = node match {
    case StreamJoin(j) =>
      s"${j.joinType.sql} stream-stream join on ${j.leftKeys.zip(j.rightKeys)
        .map { case (l, r) => s"${l.sql} = ${r.sql}" }.mkString(" AND ")}"
    case other => other.nodeName
  }

  /**
   * The plan of a group, or why it cannot run as one StreamingUMJoin (with the session's UMJoin
   * settings `conf`; `inputWatermark`, the one Spark's simulation gives the group's operator,
   * where known); its operator's state from `operatorOf`; the files of an earlier version checked
   * on the run's first micro-batch (`firstOfRun`). `mismatched` hears, per operator, why a
   * checkpoint's recorded layout does not fit the group tried. With `takeOverFormat`, the
   * checkpoint holds the state of Spark's joins (in that join state format), which the group
   * takes over in this micro-batch unless it did earlier in the run.
   */
  private def tryPlan(group: MultiJoinGroup[SparkPlan], conf: UMJoinConf,
      inputWatermark: Option[Long],
      operatorOf: Seq[SparkPlan] => Option[StatefulOperatorStateInfo], firstOfRun: Boolean,
      mismatched: mutable.Map[Long, String],
      takeOverFormat: Option[Int]): Either[String, StreamingGroupPlan] = {
    val stateful = group.members.collect { case StreamJoin(j) => j }
    val unmarked = group.inputs.map(placeable)
    // Rows of this micro-batch's streams, by Spark's estimate (None: one of them is not estimated).
    val batchRows = group.inputs.filter(PhysicalPatterns.isStreaming).map(estimatedRows)
      .foldLeft(Option(0.0))((sum, rows) => for (s <- sum; r <- rows) yield s + r)
    def stored(input: SparkPlan): Boolean =
      StaticStoring.stores(conf.staticTables, estimatedRows(input), batchRows)
    val kinds = group.inputs.map(kindOf(_, stored)).toIndexedSeq
    val streams = kinds.indices.filter(kinds(_) == InputKind.Stream)
    // Columns the group's projections compute (renamed, re-marked or computed), as expressions over
    // the inputs' columns.
    val aliases: Map[ExprId, Expression] =
      group.members.collect { case p: ProjectExec =>
        p.projectList.collect { case a: Alias => a.exprId -> a.child }
      }.flatten.toMap
    def resolve(e: Expression): Expression = e.transformUp {
      case a: Attribute if aliases.contains(a.exprId) => resolve(aliases(a.exprId))
    }
    def joinConjuncts(j: StreamJoin): Seq[Expression] =
      (j.leftKeys.zip(j.rightKeys).map { case (l, r) => EqualTo(l, r) } ++
        j.condition.full.toSeq.flatMap(splitConjunctivePredicates)).map(resolve)
    val semiAndOuter = semiAndOuterJoins(group, kinds)
    val (semiJoins, outerJoins) = semiAndOuter.getOrElse((Nil, Nil))
    val nonInner = semiJoins ++ outerJoins
    val conjuncts = group.members.flatMap {
      case StreamJoin(j) if nonInner.exists(_._1.node eq j.node) => Nil
      case StreamJoin(j) => joinConjuncts(j)
      case j: BaseJoinExec =>
        j.leftKeys.zip(j.rightKeys).map { case (l, r) => EqualTo(l, r) } ++
          j.condition.toSeq.flatMap(splitConjunctivePredicates)
      case f: FilterExec => splitConjunctivePredicates(f.condition)
      case _ => Nil
    }.map(resolve)
    val lateFilters = sideLateFilters(group, stateful, kinds, resolve)
    val outputWatermarkShift = JoinWatermarks.outputShiftMs(group, stateful)
    val filters = lateFilters.getOrElse(Nil)
    val unmarkedOutputs = unmarked.map(_.output)
    val combined = filters.filterNot(_.atArrival(unmarkedOutputs))
    val marks = unmarked.indices.map(i =>
      combined.filter(_.streams.contains(i)).map(StreamingWatermarks.mark))
    val inputs = unmarked.zip(marks)
      .map { case (input, m) => if (m.isEmpty) input else ProjectExec(input.output ++ m, input) }
    val outputs = inputs.map(_.output)
    // The group's output computed from the inputs' columns; the StreamingUMJoin puts out those it
    // reads.
    val resultColumns = group.root.output.map(a => a -> resolve(a))
    val computed = resultColumns.exists { case (a, e) => !(e.isInstanceOf[Attribute] &&
      e.asInstanceOf[Attribute].exprId == a.exprId) }
    val read = AttributeSet(resultColumns.flatMap(_._2.references))
    val resultInputs = outputs.flatten.filter(read.contains).distinct
    val stateInfo = operatorOf(group.members)
    val checkpoint = stateInfo.map(new OperatorCheckpoint(_, session.sessionState.newHadoopConf()))
    // The group takes Spark's joins' state over unless it did earlier in this run. The layout
    // record, read once per run (the operator keeps what it writes in the run); not in a take-over
    // (a record left by one that did not finish is written again).
    val takesOver = takeOverFormat.filter(_ => stateInfo.exists(info =>
      !StreamingRun.of(session, info.queryRunId).ranVersions.contains(info.operatorId)))
    lazy val takeOver = takesOver.map(
      takeOverOf(group, stateful, kinds, operatorOf, inputWatermark.isDefined, _))
    val record = checkpoint.filter(_ => takesOver.isEmpty)
      .fold[Either[String, Option[String]]](Right(None)) { c =>
        val records = StreamingRun.of(session, stateInfo.get.queryRunId).layoutRecords
        Option(records.get(stateInfo.get.operatorId)).map(Right(_)).getOrElse(
          c.layoutRecord.map { text => records.put(stateInfo.get.operatorId, text); text })
      }
    // A group without a stream-stream join has UMJoin state only if it ran as one before (the
    // checkpoint's choice then stays).
    val recorded = stateful.isEmpty && record.exists(_.isDefined)
    if (streams.isEmpty) Left("it reads no stream")
    else if (stateInfo.isEmpty)
      Left("the streaming query it belongs to is not found (UMJoin stores static tables in " +
        "micro-batch queries only)")
    else if (stateful.isEmpty && !recorded && !kinds.contains(InputKind.StaticStored)) {
      val reread = group.inputs.indices.find(i => kinds(i) == InputKind.StaticPartitioned &&
        StaticVersions.versionable(placeable(group.inputs(i))))
      val rereadByAuto = reread.filter(_ => conf.staticTables == StaticTablesMode.Auto).map(i =>
        s" (${StaticStoring.rereadBecause(estimatedRows(group.inputs(i)), batchRows)})")
      Left("it joins one stream with tables that are broadcast or read again every micro-batch " +
        "(spark.umjoin.staticTables=reread or auto, or tables UMJoin cannot know unchanged), " +
        "which Spark's stream-static joins do as well, without state" + rereadByAuto.getOrElse(""))
    }
    else if (stateful.isEmpty && stateInfo.get.storeVersion > 0 &&
        StoreLayout.forSession(session.sessionState.conf) == StoreLayout.Separate &&
        !(recorded && committedBefore(stateInfo.get, checkpoint.get)))
      Left(s"the query ran micro-batch ${stateInfo.get.storeVersion - 1}" +
        " without UMJoin's state for it (its stores have no version " +
        s"${stateInfo.get.storeVersion}, and Spark's HDFS-backed state store, which the " +
        "checkpoint keeps, cannot start one at a later version: RocksDB's can); use a new " +
        "checkpoint location to store its static tables")
    // Spark checks a restarted query's stateful operators against its checkpoint on the run's first
    // micro-batch only, and refuses one with no state there: a group that starts its stores in
    // this checkpoint (Spark's stream-static join kept none) starts them in the run's second.
    else if (stateful.isEmpty && stateInfo.get.storeVersion > 0 && firstOfRun &&
        !(recorded && committedBefore(stateInfo.get, checkpoint.get)))
      Left(s"the query ran micro-batch ${stateInfo.get.storeVersion - 1}" +
        " as Spark's stream-static join, without state; it converts from this run's next " +
        "micro-batch on, its stores starting empty there (Spark checks a restarted query's " +
        "stateful operators against the checkpoint in the run's first micro-batch, and refuses " +
        "one the checkpoint has no state for)")
    else if (semiAndOuter.isLeft) Left(semiAndOuter.swap.toOption.get)
    else if (takeOver.exists(_.isLeft)) Left(takeOver.get.swap.toOption.get)
    else if (lateFilters.isLeft) Left(lateFilters.swap.toOption.get)
    else if (outputWatermarkShift.isLeft) Left(outputWatermarkShift.swap.toOption.get)
    else JoinGraph.build(outputs, conjuncts, if (computed) resultInputs else group.root.output,
        filterJoins = semiJoins.map { case (j, o) => FilterJoin(o, LeftSemi, joinConjuncts(j)) },
        outerJoins = outerJoins.map { case (j, o) => OuterJoin(o, joinConjuncts(j)) },
        oneKeyPerNonInnerJoin = true).flatMap { graph =>
      val conditions = conjuncts ++ nonInner.flatMap(o => joinConjuncts(o._1))
      lazy val distances = StreamingWatermarks.timeDistances(outputs, conditions)
      // The streams whose later rows are known to pass the watermark: a late filter checks their
      // own event-time column.
      val checked = streams.filter(m => StreamingWatermarks.eventTimeColumn(unmarkedOutputs(m))
        .exists(t => filters.exists(_.time.semanticEquals(t)))).toSet
      // Whether the combinations waiting for semi join o's match can ever go (Spark's own analysis
      // refuses the query otherwise).
      def unmatchable(o: Int, watermark: Long): Option[Expression] =
        StreamingWatermarks.unmatchableRows(o, graph.joined.filter(_ != o), outputs, graph.classes,
          distances, watermark, checked)
      lazy val unboundedSemi = semiJoins.find { case (_, o) => unmatchable(o, 0L).isEmpty }
      // The late filters over partial combinations, each as one condition per stream below it, on
      // that stream's mark.
      val lateConditions = combined.flatMap { f =>
        f.streams.map { r =>
          val mark = outputs(r).find(_.name == StreamingWatermarks.mark(f).name).get
          ResidualCondition(StreamingWatermarks.notLate(f, mark), inputs.indices.filter(i =>
            f.time.references.intersect(AttributeSet(outputs(i))).nonEmpty).toSet + r)
        }
      }
      lazy val padding = paddingOf(graph, outerJoins, outputs, resolve)
      if (!graph.isConnected)
        Left("its inputs are not all connected by equi-join keys (a stream-stream join needs one)")
      else if (nonInner.exists { case (j, o) => nonInnerJoinRefusal(graph, j, o).isDefined })
        Left(nonInner.flatMap { case (j, o) => nonInnerJoinRefusal(graph, j, o) }.head)
      else if (unboundedSemi.isDefined)
        Left(s"no watermark and condition of its ${describe(unboundedSemi.get._1)} bound when a " +
          ("combination of its preserved side can no longer find a match, so none would ever " +
            "be let go"))
      else if (padding.isLeft) Left(padding.swap.toOption.get)
      else if (outerJoins.nonEmpty && firstOfRun &&
          checkpoint.exists(_.hasUnmatchedStores(outerJoins.map(_._2).toSet)))
        throw new IllegalStateException(checkpoint.get.refusal(
          "its outer join's waiting combinations were written by an earlier version of UMJoin, " +
            "which kept them in a store this version no longer reads"))
      else {
        val info = stateInfo.get
        def plannedWith(layout: GroupLayout): Either[String, StreamingGroupPlan] = {
          val evictionWatermark = stateful.flatMap(_.evictionWatermark).minOption
          val (graphShape, graphExpressions) =
            graph.copy(residuals = graph.residuals ++ lateConditions).split
          val paddingPlan = padding.toOption.flatten
          val spec = GroupSpec(
            inputLabels = group.inputs.map(label),
            graphShape = graphShape,
            layout = layout,
            paddingStarts = paddingPlan.fold(Map.empty[Int, Int])(_.starts),
            sliceBounds = inputs.indices.map { j =>
              if (!layout.maySlice(j)) Nil
              else streams.filter(_ != j).flatMap { m =>
                for (time <- StreamingWatermarks.eventTimeColumn(outputs(m))
                     if SliceWindow.isTimestamp(time.dataType);
                     behind <- distances(j)(m); ahead <- distances(m)(j))
                  yield SliceWindow.Bound(m, time, behind, ahead)
              }
            },
            outputWatermarkShiftMs = outputWatermarkShift.getOrElse(0L),
            evictionWatermark = evictionWatermark,
            inputWatermark = inputWatermark,
            // An outer or semi join's non-preserved side is probed last in every route.
            probeOrder = if (graph.outer.isEmpty && graph.filters.isEmpty) conf.probeOrder
              else conf.probeOrder.copy(policy = ProbeOrderPolicy.Fixed),
            stateTtlMs = conf.stateTtlMs,
            stateCacheRows = conf.stateCacheRows,
            staticCache = conf.staticCache,
            takeOver = takeOver.flatMap(_.toOption))
          val operator = StreamingUMJoinExec(
            output = if (!computed) group.root.output else resultInputs.map { a =>
              // An outer join pads its non-preserved input's columns with NULLs.
              if (outerJoins.exists { case (_, o) => AttributeSet(outputs(o)).contains(a) })
                a.withNullability(true) else a
            },
            spec = spec,
            graphExpressions = graphExpressions,
            lateRows = inputs.indices.map(i =>
              if (kinds(i) != InputKind.Stream) None
              else StreamingWatermarks.lateRows(i, filters.filter(_.atArrival(unmarkedOutputs)))),
            evictable = inputs.indices.map { i =>
              if (kinds(i) != InputKind.Stream) None
              else {
                // A stored row also stays until every combination it is in was padded where due
                // (see OuterPadding).
                val padded = paddingPlan.map { p =>
                  outerJoins.map { case (j, o) =>
                    if (i == p.starts(o)) Some(p.now(o))
                    else StreamingWatermarks.paddedBefore(i, p.starts(o), outputs, distances,
                      preservedStateWatermark(j, j.evictionWatermark))
                  }
                }
                (StreamingWatermarks.evictableRows(i, outputs, graph.classes,
                  distances, evictionWatermark, streams, checked) +: padded.getOrElse(Nil))
                  .reduce((a, b) => for (x <- a; y <- b) yield And(x, y))
              }
            },
            unmatchable = inputs.indices.map(o =>
              if (semiJoins.exists(_._2 == o))
                evictionWatermark.flatMap(unmatchable(o, _)) else None),
            paddedNow = inputs.indices.map(i => paddingPlan.flatMap(_.now.get(i))),
            paddedBefore = inputs.indices.map(i => paddingPlan.flatMap(_.before.get(i))),
            stateInfo = Some(info),
            children = inputs)
          Right(StreamingGroupPlan(operator, marks,
            project = Option.when(computed)(resultColumns.map {
              case (a, e: Attribute) if e.exprId == a.exprId => a
              case (a, e) => Alias(e, a.name)(a.exprId, a.qualifier, Some(a.metadata))
            })))
        }
        // The event times a stream's row can be joined across: the widest range the conditions
        // allow another stream's around it.
        def timeSpanMs(i: Int): Option[Long] = streams.filter(_ != i).flatMap(m =>
          for (ahead <- distances(i)(m); behind <- distances(m)(i)) yield ahead + behind)
          .filter(_ > 0).maxOption
        // At first as many slices as tasks run at once (Spark's default parallelism: the cores
        // unless set); with `auto` then the count of least predicted time from what the batch
        // before measured (PSP's model, paper 004: SliceCount).
        val cores = session.sparkContext.defaultParallelism
        val firstSlices = conf.timeSlices.getOrElse(cores).min(info.numPartitions)
        val run = StreamingRun.of(session, info.queryRunId)
        val measured = Option(run.sliceCosts.get(info.operatorId))
        def slices(i: Int, current: TimeSlicing): Int =
          conf.timeSlices.map(_.min(info.numPartitions)).getOrElse {
            measured.flatMap(_.measuredBefore(info.storeVersion, i)).fold(current.slices) { costs =>
              val count = SliceCount.best(costs, current.slices, cores, info.numPartitions)
              if (count != current.slices) {
                logInfo(s"UMJoin: operator ${info.operatorId} input $i: $count" +
                  s" time slices per window instead of ${current.slices}, " +
                  f"from micro-batch ${info.storeVersion - 1}: ${
                    costs.testNanos}%.0f ns per stored row tested, " +
                  f"${costs.rowsPerSpan}%.1f rows per window, ${
                    costs.sendNanos}%.0f ns per combination shipped")
              }
              count
            }
          }
        def drained(i: Int): Boolean = Option(run.sliceDrains.get((info.operatorId, i)))
          .exists(_.drainedBefore(info.storeVersion, info.numPartitions))
        def reported(i: Int): Option[SlicedRows] =
          measured.flatMap(_.rowsBefore(info.storeVersion, i))
        // The time slicing last recorded; a micro-batch that recorded a change (run again after a
        // failure) keeps it.
        def continued(recorded: StreamingLayout): StreamingLayout =
          if (!recorded.timeSlices.exists(_.isDefined)) recorded
          else run.recordedSlicing(info.operatorId,
              checkpoint.get.recordedSlicing(info.storeVersion)) match {
            case Some((version, slicing)) if version == info.storeVersion =>
              recorded.copy(timeSlices = slicing)
            case changed => changed.fold(recorded)(c => recorded.copy(timeSlices = c._2))
              .resliced(slices, timeSpanMs, drained, reported)
          }
        // A new checkpoint's layout is chosen when the operator runs its first micro-batch, from
        // that micro-batch's figures.
        def fromFirstMicroBatch: GroupLayout = {
          val (estimated, estimatedText) = estimatedSizes(inputs, kinds, graph)
          val spans = inputs.indices.map(timeSpanMs)
          GroupLayout.FromFirstMicroBatch(kinds, estimated, estimatedText, info.numPartitions,
            !conf.probeOrder.adaptive, spans, firstSlices,
            StoreLayout.forSession(session.sessionState.conf),
            inputs.indices.map(i =>
              StreamingLayout.sliceable(graph, kinds, i, info.numPartitions, spans(i))))
        }
        record.flatMap(checkpoint.get.layoutOf(_, graph, outputs)).map(_.fold(fromFirstMicroBatch)(
          recorded => GroupLayout.Decided(continued(recorded)))) match {
          // A checkpoint written for another group: this group does not run; if no group with this
          // operator's state runs, the checkpoint check tells why (splitting tries several groups).
          case Left(refusal) if stateful.isEmpty => throw new IllegalStateException(refusal)
          case Left(refusal) =>
            mismatched(info.operatorId) = refusal
            Left(refusal)
          case Right(layout) => plannedWith(layout)
        }
      }
    }
  }

  /**
   * Where each of the group's inputs' rows are in the state of Spark's joins (its members), in
   * join state format `format`, or why the group cannot take that state over: each input must be
   * a side of one of the joins (no projection or filter between), the joins inner, the query
   * without watermarks (`watermarked`: Spark's joins then evict nothing, so every input's rows are
   * in the join it is a side of), the inputs streams.
   */
  private def takeOverOf(group: MultiJoinGroup[SparkPlan], joins: Seq[StreamJoin],
      kinds: IndexedSeq[InputKind],
      operatorOf: Seq[SparkPlan] => Option[StatefulOperatorStateInfo], watermarked: Boolean,
      format: Int): Either[String, SparkJoinTakeOver] = {
    def keySchema(keys: Seq[Expression]): StructType = StructType(keys.zipWithIndex.map {
      case (k, i) => StructField(s"field$i", k.dataType, k.nullable)
    })
    val ids = joins.map(j => operatorOf(Seq(j.node)).get.operatorId)
    val sides = group.inputs.map { input =>
      joins.zip(ids).flatMap { case (j, id) =>
        Seq((SparkJoinSide.Left, j.left, j.leftKeys), (SparkJoinSide.Right, j.right, j.rightKeys))
          .collect { case (side, child, keys) if child eq input =>
            SparkJoinInputState(id, side, keySchema(keys))
          }
      }
    }
    if (joins.exists(_.joinType != Inner)) {
      Left(s"${describe(joins.find(_.joinType != Inner).get)}: UMJoin takes over the state " +
        "of inner joins only, so far")
    } else if (watermarked) {
      Left("the query has watermarks: UMJoin takes over the state of joins that evict nothing " +
        "only, so far")
    } else if (kinds.exists(_ != InputKind.Stream)) {
      Left("it joins static tables: UMJoin takes over the state of joins of streams only, so far")
    } else sides.indexWhere(_.size != 1) match {
      case -1 => Right(SparkJoinTakeOver(format, sides.map(_.head).toIndexedSeq, ids))
      case i => Left(s"its input ${label(group.inputs(i))} is not a side of one of its joins " +
        s"(a projection or filter between): its rows are not all in Spark's join state")
    }
  }

  /**
   * Whether the operator committed its stores in the micro-batch before: it ran that micro-batch
   * in this run (whose failure would have ended the run), else its checkpoint says.
   */
  private def committedBefore(info: StatefulOperatorStateInfo,
      checkpoint: OperatorCheckpoint): Boolean =
    StreamingRun.of(session, info.queryRunId).ranVersions.get(info.operatorId)
      .contains(info.storeVersion - 1) || checkpoint.committedBefore

  /**
   * Whether a stream-stream join of the group has no equi-join key but the time slice
   * ([[WindowJoinSlices]]).
   */
  private def timeSliced(group: MultiJoinGroup[SparkPlan]): Boolean = group.members.exists {
    case StreamJoin(j) => j.leftKeys.exists(_.isInstanceOf[TimeSlice])
    case _ => false
  }

  /**
   * The group's semi joins, lowest first, and its outer joins, each with the index of its
   * non-preserved input, or why the group cannot run them: semi joins one above the other (each
   * reads the combinations the one below lets through) or side by side, and outer joins, anywhere
   * in the group (no join above an outer join is on its padded columns, filters may read them:
   * [[nonInnerJoinRefusal]]; nothing above a semi join reads its non-preserved side, whose columns
   * it does not put out); each join's non-preserved side one streaming input of the group (a
   * stream, or a join tree's output the group's splitting cut off).
   */
  private def semiAndOuterJoins(group: MultiJoinGroup[SparkPlan], kinds: IndexedSeq[InputKind])
      : Either[String, (Seq[(StreamJoin, Int)], Seq[(StreamJoin, Int)])] = {
    val (semis, outers) = group.members.collect {
      case StreamJoin(j) if j.joinType == LeftOuter ||
          j.joinType == RightOuter || j.joinType == LeftSemi => j
    }.partition(_.joinType == LeftSemi)
    def nonPreservedOf(j: StreamJoin): Either[String, (StreamJoin, Int)] = {
      val nonPreserved = if (j.joinType == RightOuter) j.left else j.right
      val input = group.inputs.indexWhere(_ eq nonPreserved)
      // A join tree there is cut off by the group's splitting: its output is then one stream input
      // of the group.
      if (input < 0) Left(s"the non-preserved side of its ${describe(j)} is a join, not one stream")
      else if (kinds(input) != InputKind.Stream)
        Left(s"the non-preserved side of its ${describe(j)} is not a stream")
      else Right((j, input))
    }
    val found = (semis ++ outers).map(nonPreservedOf)
    found.collectFirst { case Left(reason) => reason }.toLeft {
      val joins = found.flatMap(_.toOption)
      // In input order, the tree's from left to right: a semi join's non-preserved stream comes
      // after the one of every semi join below it.
      (joins.filter(_._1.joinType == LeftSemi).sortBy(_._2),
        joins.filter(_._1.joinType != LeftSemi))
    }
  }

  /**
   * When the group's outer joins pad (see [[OuterPadding]]), or why that cannot be told as Spark
   * tells it: each join's preserved side is evicted from its state, unmatched rows put out with
   * NULLs, by a watermark predicate on that side's event-time column (Spark's value predicate): one
   * stream's column, a stream no outer join pads (joins may read different streams' columns); and a
   * row failing the ON clause's conditions on the preserved side alone is put out so at once. Each
   * ON clause reads the group's inner inputs and its own stream.
   */
  private def paddingOf(graph: JoinGraph, outerJoins: Seq[(StreamJoin, Int)],
      outputs: Seq[Seq[Attribute]],
      resolve: Expression => Expression): Either[String, Option[PaddingPlan]] =
    if (outerJoins.isEmpty) Right(None) else {
    val outerInputs = outerJoins.map(_._2).toSet
    def inputsOf(e: Expression): Set[Int] =
      outputs.indices.filter(i => e.references.intersect(AttributeSet(outputs(i))).nonEmpty).toSet
    val found = outerJoins.map { case (j, o) =>
      val (preserved, keys, alone) =
        if (j.joinType == RightOuter) (j.right, j.rightKeys, j.condition.rightSideOnly)
        else (j.left, j.leftKeys, j.condition.leftSideOnly)
      val time = StreamingWatermarks.eventTimeColumn(preserved.output)
      val key = graph.classes(graph.outer(o).head).keyOf(o).get
      if (graph.onInputs(o).exists(outerInputs.contains))
        Left(s"the ON clause of its ${describe(j)}" +
          (" reads the non-preserved side of another outer join (a streaming UMJoin pads each " +
            "by the group's inner inputs)"))
      else if (time.isEmpty || preservedStateWatermark(j, Some(0L)).isEmpty)
        Left(s"no watermark and condition of its ${describe(j)}" +
          (" bound when a combination of its preserved side can no longer find a match, so " +
            "none would ever be let go"))
      else if (keys.exists(_.references.exists(_.metadata.contains(EventTimeWatermark.delayKey))))
        Left(s"its ${describe(j)}" +
          (" joins on its preserved side's event-time column, which Spark's state watermark " +
            "then reads by key (a streaming UMJoin pads by the event-time value)"))
      else if (key.transform { case a: Attribute => Literal(null, a.dataType) }.eval() != null)
        Left(s"the ON key ${key.sql} of its ${describe(j)}" +
          " is not NULL where the non-preserved side's columns are")
      else {
        val column = resolve(time.get)
        val starts = inputsOf(column)
        val onlyPreserved = alone.map(resolve)
        // A combination failing the conditions on the preserved side alone is padded at once, as
        // Spark does (never stored).
        def due(watermark: Option[Long]): Expression = {
          val ruledOut = preservedStateWatermark(j, watermark)
            .flatMap(w => WatermarkSupport.watermarkExpression(Some(column), Some(w)))
            .getOrElse(Literal.FalseLiteral)
          onlyPreserved.fold(ruledOut)(c =>
            Or(Not(Coalesce(Seq(c, Literal.FalseLiteral))), ruledOut))
        }
        if (starts.size != 1 || onlyPreserved.exists(c => !inputsOf(c).subsetOf(starts)))
          Left(s"the preserved side of its ${describe(j)}" +
            (" is evicted by a condition over several streams (a streaming UMJoin pads by one " +
              "stream's rows)"))
        else if (outerInputs.contains(starts.head))
          Left(s"the preserved side of its ${describe(j)}" +
            " is evicted by the event time of a stream another outer join pads with NULLs")
        else Right((o, starts.head, due(j.evictionWatermark), due(j.lateEventsWatermark)))
      }
    }
    found.collectFirst { case Left(reason) => reason }.map(Left(_)).getOrElse {
      val pads = found.flatMap(_.toOption)
      Right(Some(PaddingPlan(pads.map(p => p._1 -> p._2).toMap, pads.map(p => p._1 -> p._3).toMap,
        pads.map(p => p._1 -> p._4).toMap)))
    }
  }

  /**
   * The state watermark (ms) of the outer join's preserved side under `watermark`: its rows at or
   * below it can match no later row.
   */
  private def preservedStateWatermark(j: StreamJoin,
      watermark: Option[Long]): Option[Long] = {
    val (left, right) = StreamingSymmetricHashJoinHelper.getStateWatermark(j.left.output,
      j.right.output, j.leftKeys, j.rightKeys, j.condition.full, watermark, false)
    if (j.joinType == RightOuter) right else left
  }

  /**
   * Why the outer or semi join of non-preserved input `o` cannot run in a streaming UMJoin, if it
   * cannot: its combinations wait for a match in `o`'s partition, found by one key, and checked by
   * the join's own condition alone. (A filter above an outer join reading its padded side, such as
   * the `IS NULL` of a left anti join ([[StreamAntiJoins]]), is checked after the step decides
   * between a match and NULLs: it drops combinations and decides no match.)
   */
  private def nonInnerJoinRefusal(graph: JoinGraph, join: StreamJoin,
      o: Int): Option[String] = {
    val keys = graph.classes.indices.filter(c => graph.classes(c).inputs.contains(o))
    if (graph.outer.get(o).exists(_ != keys))
      Some(s"an equality outside the ON clause of its ${describe(join)}" +
        " reads the non-preserved side")
    else if (!graph.connects(graph.joined.toSet - o))
      Some(s"the preserved side of its ${describe(join)} is not connected by equi-join keys")
    else None
  }

  /**
   * The probe-cost model's statistics where the first micro-batch could not be measured (an input
   * keeps state of its own, or no input had rows): each input's rows as Spark estimates them from
   * the plan; without an estimate for every stream, none (all choices then differ only in how often
   * they send a row to every partition).
   */
  private def estimatedSizes(inputs: Seq[SparkPlan], kinds: IndexedSeq[InputKind],
      graph: JoinGraph): (JoinSizes, String) = {
    val rows = inputs.map(estimatedRows).toIndexedSeq
    val known = kinds.indices.forall(i => kinds(i) != InputKind.Stream || rows(i).exists(_ > 0))
    if (known) {
      val sizes = JoinSizes.fromRates(rows.map(_.getOrElse(1.0).max(1.0)),
        graph.classes.map(_.inputs).toIndexedSeq)
      (sizes, s"Spark's plan estimates: rows [${sizes.rates.map(_.toLong).mkString(", ")}]")
    } else (JoinSizes.uniform(inputs.size, graph.classes.size),
      "none (every join counted one-to-one)")
  }

  private def estimatedRows(plan: SparkPlan): Option[Double] = plan match {
    case later: PlanLater => Some(StaticStoring.estimatedRows(later.plan))
    case _ => plan.logicalLink match {
      case Some(logical) => Some(StaticStoring.estimatedRows(logical))
      case None => plan.children.headOption.flatMap(estimatedRows)
    }
  }

  /**
   * The late filter of every side of the group's stream-stream joins that has an event-time column
   * (as Spark finds it: the side's one column marked by a watermark), or why the group cannot
   * reproduce them. `resolve` turns a column of the group's projections into an expression over its
   * inputs.
   */
  private def sideLateFilters(group: MultiJoinGroup[SparkPlan],
      stateful: Seq[StreamJoin], kinds: IndexedSeq[InputKind],
      resolve: Expression => Expression): Either[String, Seq[SideLateFilter]] = {
    val sides = stateful.zipWithIndex.flatMap { case (j, k) =>
      // Spark's planned join by its operator id; a join it never planned by its place in the group.
      val id = j.stateInfo.fold(s"join$k")(s => s"op${s.operatorId}")
      Seq((j, j.left, s"${id}_left", "left"), (j, j.right, s"${id}_right", "right"))
    }
    val found = sides.map { case (j, side, filterName, name) =>
      val times = side.output.filter(_.metadata.contains(EventTimeWatermark.delayKey))
      if (times.map(_.exprId).distinct.size > 1)
        Left(s"the $name side of its ${describe(j)}" +
          s" has several event-time columns (${times.map(_.name).distinct.mkString(", ")}), " +
          "which Spark's stream-stream join refuses (MULTIPLE_EVENT_TIME_COLUMNS)")
      else times.headOption.map(resolve) match {
        case Some(time) if !time.deterministic =>
          Left(s"the event-time column of the $name side of its ${describe(j)} is computed by " +
            s"${time.sql}, which is not deterministic")
        case Some(time) =>
          val below = group.inputs.indices.filter(i => kinds(i) == InputKind.Stream &&
            side.exists(_ eq group.inputs(i)))
          Right(Option.when(below.nonEmpty)(SideLateFilter(filterName, below, time,
            j.lateEventsWatermark)))
        case None => Right(None)
      }
    }
    found.collectFirst { case Left(reason) => reason }.toLeft(found.flatMap(_.toOption.flatten))
  }

  private def kindOf(input: SparkPlan, stored: SparkPlan => Boolean): InputKind =
    if (PhysicalPatterns.isStreaming(input)) InputKind.Stream
    else input match {
      case _: BroadcastExchangeExec => InputKind.StaticBroadcast
      case _ if StaticVersions.versionable(placeable(input)) && stored(input) =>
        InputKind.StaticStored
      case _ => InputKind.StaticPartitioned
    }

  /**
   * An input without the broadcast its stand-in join has on it (see [[StreamingPlannerStrategy]]):
   * the StreamingUMJoin places its inputs itself.
   */
  private def placeable(input: SparkPlan): SparkPlan = input match {
    case b: BroadcastExchangeExec => b.child
    case other => other
  }

  private def build(group: MultiJoinGroup[SparkPlan], plan: StreamingGroupPlan,
      converted: Seq[SparkPlan], conf: UMJoinConf): SparkPlan = {
    val spec = plan.operator.spec
    if (spec.probeOrder != conf.probeOrder) {
      val message = s"the StreamingUMJoin of operator ${plan.operator.getStateInfo.operatorId}" +
        s" keeps its routes instead of choosing them by ${conf.probeOrder.policy.name}" +
        ": its outer or semi join's non-preserved side is probed last in every route"
      if (StreamingRun.of(session, plan.operator.getStateInfo.queryRunId)
          .firstNote(message, unconverted = false)) {
        logInfo(s"UMJoin: $message")
      }
    }
    // A static table Spark would broadcast is broadcast; the other inputs are placed in the
    // state's partitions by their exchanges (built by the operator when it chooses a new layout).
    val children = converted.zipWithIndex.map { case (input, j) =>
      if (spec.layout.broadcast(j))
        BroadcastExchangeExec(IdentityBroadcastMode, input)
      else if (plan.marks(j).isEmpty) input
      else ProjectExec(input.output ++ plan.marks(j), input)
    }
    // Labelled by the inputs as planned (a stand-in names its logical leaves).
    val umjoin = plan.operator.copy(spec = spec.copy(inputLabels = converted.map(label)),
      children = children)
    logInfo(s"UMJoin: ${group.members.count(StreamJoin.unapply(_).isDefined)}" +
      s" stream-stream joins become ${umjoin.simpleString(10)}")
    plan.project.fold[SparkPlan](umjoin)(ProjectExec(_, umjoin))
  }

  /**
   * What an input reads: its files' directory (a file source: a micro-batch reads a stream's files
   * by name, a static table by its directory), else its leaf's name.
   */
  private def label(input: SparkPlan): String = {
    def files(paths: Seq[Path], streaming: Boolean): String = paths.headOption
      .map(p => if (streaming) Option(p.getParent).getOrElse(p) else p).map(_.getName)
      .getOrElse("files")
    input.collectLeaves().flatMap {
      case scan: FileSourceScanExec =>
        Seq(files(scan.relation.location.rootPaths, PhysicalPatterns.isStreaming(scan)))
      case later: PlanLater => later.plan.collectLeaves().map {
        case r: LogicalRelation => r.relation match {
          case fs: HadoopFsRelation => files(fs.location.rootPaths, r.isStreaming)
          case _ => r.nodeName
        }
        case leaf => leaf.nodeName
      }
      case leaf => Seq(leaf.nodeName)
    }.distinct.mkString("+")
  }
}

object StreamingGroupPlanner {
  val AdaptiveStreamStatic: String = "the stream-static joins of this query stay " +
    "as Spark planned them, adaptively: no join of a stream with at least spark.umjoin.minInputs " +
    "inputs reads a table UMJoin would store (one read from files, too large to broadcast, with " +
    "spark.umjoin.staticTables=store; with auto, the default, also estimated by Spark at " +
    f"${StaticStoring.MinTableRows}%.0f rows or more and " +
    f"${StaticStoring.TableRowsPerBatchRow}%.0f times the micro-batch's stream rows), so its " +
    "micro-batches are planned as without UMJoin"

  /** A StreamingUMJoin's state that this run would not read: the error, with the fix. */
  def umjoinStateUnread(checkpointLocation: String, operatorId: Long): IllegalStateException =
    new IllegalStateException(s"The checkpoint $checkpointLocation" +
      s" holds StreamingUMJoin state for operator $operatorId" +
      (", but this run plans Spark's joins there (spark.umjoin.enabled is " +
        "false, or the ") +
      ("join no longer converts). Restart with the settings the checkpoint was written " +
        "with, or use a new checkpoint location."))
}
