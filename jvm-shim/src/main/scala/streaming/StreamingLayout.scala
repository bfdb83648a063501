package umjoin.spark.streaming

import scala.collection.mutable

import org.apache.spark.sql.catalyst.expressions.Expression
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.{ByteType, DataType, IntegerType, LongType, ShortType}

import umjoin.spark.core.JoinGraph
import umjoin.spark.core.cost.{CostGraph, JoinSizes, ProbeCost, ProbeGraph}
import umjoin.spark.core.probe.{ProbeSteps, Route, StoreIndex}

/** How an input of a streaming UMJoin takes part. */
sealed trait InputKind {
  /** As `explain()` and the checkpoint's layout record name it. */
  def name: String
}

object InputKind {
  /**
   * Its rows arrive in micro-batches and are kept as state, in stores partitioned by one of its
   * join keys.
   */
  case object Stream extends InputKind { override val name = "stream" }
  /**
   * A batch table, broadcast to every task in every micro-batch, as Spark's stream-static join
   * broadcasts it.
   */
  case object StaticBroadcast extends InputKind { override val name = "static broadcast" }
  /**
   * A batch table too large to broadcast whose rows cannot be known unchanged between micro-batches
   * (it reads a source other than files, or a nondeterministic expression): read and
   * hash-partitioned again in every micro-batch, as Spark's stream-static join does.
   */
  case object StaticPartitioned extends InputKind { override val name = "static" }
  /**
   * A batch table too large to broadcast, read from files: kept in stores partitioned and indexed
   * like a stream's, written when the query (re)starts and again only when the table changes
   * ([[umjoin.spark.streaming.StaticVersions]]); between, the micro-batches probe the stores and
   * never read the table.
   */
  case object StaticStored extends InputKind { override val name = "static stored" }

  val byName: Map[String, InputKind] =
    Seq(Stream, StaticBroadcast, StaticPartitioned, StaticStored).map(k => k.name -> k).toMap

  /** Kinds whose rows live in the StreamingUMJoin's state stores. */
  def isStored(kind: InputKind): Boolean = kind == Stream || kind == StaticStored
}

/**
 * How a StreamingUMJoin's stores are kept in each partition: every commit of a store writes files,
 * so the fewer store instances, the shorter a micro-batch's commits (as Spark's join state formats
 * 3 and 4 keep a join's four stores as column families of one).
 */
sealed trait StoreLayout {
  /** As the checkpoint's layout record names it. */
  def name: String
  /** Whether every store of a partition is a column family of the partition's one store. */
  def oneStorePerPartition: Boolean = false
  /**
   * Whether an input's rows' store keeps one entry per value of the input's partitioning key, the
   * rows of that value as a list (else one entry per row).
   */
  def rowsListedByKey: Boolean = false
}

object StoreLayout {
  /**
   * A state store of its own for each input's rows, for each further index and for each semi
   * join's waiting combinations: the HDFS-backed provider (which has no column families), and
   * checkpoints of layout format 3 and before.
   */
  case object Separate extends StoreLayout { override val name = "separate" }

  /**
   * One RocksDB store per partition, named [[InputState.PartitionStoreName]], with the rows and
   * further indexes of every input as its column families and each input's count of rows in its
   * default one: committed once per partition and micro-batch. A semi join's waiting combinations
   * keep a store of their own, written in the stage that settles them, which may come before the
   * last. Checkpoints of layout format 4.
   */
  case object ColumnFamilies extends StoreLayout {
    override val name = "column families"
    override def oneStorePerPartition: Boolean = true
  }

  /**
   * As [[ColumnFamilies]], but each input's rows' family keeps one entry per value of its
   * partitioning key: that value's rows, appended as they arrive (RocksDB's merge), so a probe is
   * one point lookup, which RocksDB's Bloom filters answer without reading a file where no row has
   * the value, where a scan of a key's entries opens an iterator on every level (as Spark's join
   * state format 4 keeps a key's rows). Checkpoints of layout format 5 on.
   */
  case object RowLists extends StoreLayout {
    override val name = "row lists"
    override def oneStorePerPartition: Boolean = true
    override def rowsListedByKey: Boolean = true
  }

  val byName: Map[String, StoreLayout] =
    Seq(Separate, ColumnFamilies, RowLists).map(l => l.name -> l).toMap

  /** Spark's RocksDB provider (Scala-private to its package: named). */
  val RocksDBProvider = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

  /** The layout a new checkpoint's state takes with the session's state store provider. */
  def forSession(conf: SQLConf): StoreLayout =
    if (conf.stateStoreProviderClass == RocksDBProvider) RowLists else Separate
}

/**
 * How a streaming UMJoin keeps and probes its inputs: per input its kind, the key class its rows
 * are hash-partitioned on (None for a broadcast table), the further indexes of a stream's store
 * (so that a row sent to all partitions finds its matches by keys it carries; an index on several
 * classes is one multi-column key), and the route of every stream's new rows. Chosen by the
 * probe-cost model (CLASH paper 002, [[ProbeCost]]) when a query starts on a new checkpoint, and
 * read back from the checkpoint ever after: the state is laid out by it. `statistics` says what the
 * model's figures were (shown in `explain()`).
 *
 * `timeSlices`: per input, how its rows are spread over the partitions by time slice (PSP paper
 * 004, PSP), where it is partitioned on a time-slice class ([[TimeSlice]]: a join without an
 * equi-join key, whose one value would put the whole state in one partition). Such a store keeps
 * each row in the partition of its event time's slice ([[TimeSliceRing]]), and a partial
 * combination is sent to the partitions of the slices its time range overlaps ([[SliceWindow]]):
 * every row is stored once, and a combination found once, where its row of that store lives.
 * `stores`: how the stores are kept in each partition.
 */
final case class StreamingLayout(
    kinds: IndexedSeq[InputKind],
    partitionClass: IndexedSeq[Option[Int]],
    indexes: IndexedSeq[Seq[StoreIndex]],
    routes: Map[Int, Route],
    predictedCost: Double,
    statistics: String,
    timeSlices: IndexedSeq[Option[TimeSlicing]],
    stores: StoreLayout) {

  /** Whether input `i`'s rows are spread over the partitions by time slice. */
  def isTimeSliced(i: Int): Boolean = timeSlices(i).isDefined

  /**
   * This layout with `slices(i, current)` slices per span for every input i spread by time slice
   * (`spanMs(i)`, see [[TimeSlicing]]), balanced by the rows' rates and cut past the event times of
   * the rows stored, as the micro-batch before reported them (`rows(i)`: None where not known,
   * and then nothing changes). A slicing recorded by a version before stretches keeps its count
   * until its earlier rows are `drained(i)`.
   */
  def resliced(slices: (Int, TimeSlicing) => Int, spanMs: Int => Option[Long],
      drained: Int => Boolean, rows: Int => Option[SlicedRows]): StreamingLayout =
    copy(timeSlices = timeSlices.indices.map { i =>
      timeSlices(i).map { current =>
        val kept = if (drained(i)) current.copy(earlierWidthsMs = Nil) else current
        (for (reported <- rows(i); span <- spanMs(i) if kept.earlierWidthsMs.isEmpty) yield {
          val count = slices(i, kept)
          kept.recut(count, TimeSlicing.balancedWidth(span, count, reported,
            Option.when(count == kept.slices)(kept.widthMs)), reported.stored.range)
        }).getOrElse(kept)
      }
    })

  def streams: Seq[Int] = kinds.indices.filter(kinds(_) == InputKind.Stream)

  /** The inputs whose rows live in state stores (see [[StreamingLayout.storedOf]]). */
  def stored: Seq[Int] = StreamingLayout.storedOf(kinds)

  /**
   * `route` planned over `graph` as this layout runs it: a store partitioned on a class whose value
   * the combination carries is reached by that value: in the same task where the combination is in
   * that value's partition already (it was placed by a value known equal: the same input's same
   * expression, or one a step matched with it), else shuffled there; and probed through its
   * partitioning index. The value of a class is also the value of another class carried where the
   * probed input's key is the same expression in both (an order key that several outer joins
   * match, each in a class of its own). Any other store is reached in all partitions and probed by
   * its widest index whose classes the combination all carries (one through the route's edge where
   * there is one), or else by an index whose classes it carries as the same expression of the
   * store. A static table indexed in memory per batch is probed by every class of it the
   * combination carries.
   */
  def plan(graph: JoinGraph, route: Route): Route.Plan = {
    val access = reaches(graph, route)
    val lookup = route.order.tail.zip(access.map(_._2)).toMap
    val planned = ProbeSteps.along(graph, route, input => Seq(lookup(input)))
    planned.copy(
      steps = planned.steps.zip(access).map { case (step, (reach, _)) => step.copy(reach = reach) })
  }

  /**
   * Per step of `route`: how the combinations reach the store, and the index it is probed through
   * (see [[plan]]).
   */
  private def reaches(graph: JoinGraph, route: Route): Seq[(Route.Reach, StoreIndex)] = {
    def classesOf(input: Int): Set[Int] =
      graph.classes.indices.filter(graph.classes(_).inputs.contains(input)).toSet
    def key(input: Int, c: Int): Expression = graph.classes(c).keyOf(input).get.canonicalized
    // Per bound class, the expression its value comes from (the first bound input's), as ProbeSteps
    // binds it.
    val value = mutable.Map[Int, Expression]()
    def bind(input: Int): Unit =
      classesOf(input).foreach(c => if (!value.contains(c)) value(c) = key(input, c))
    // The values the combination's partition is the hash of: the one that placed it, and those
    // known equal to it.
    val placedBy = mutable.Set[Expression]()
    partitionClass(route.start).filterNot(_ => isTimeSliced(route.start))
      .foreach(c => placedBy += key(route.start, c))
    bind(route.start)
    route.edges.map { case (from, to) =>
      val carried = StoreIndex((classesOf(to) intersect value.keySet).toSeq.sorted)
      val step = partitionClass(to) match {
        case None => (Route.Reach.Local, carried)
        // A store spread by time slice is reached in all partitions, each probing its slice.
        case Some(p) => (if (isTimeSliced(to)) None
            else ProbeSteps.servingClass(graph, to, p, value.contains)) match {
          case Some(c) =>
            val reach = if (placedBy.contains(value(c))) Route.Reach.Local else {
              placedBy.clear()
              placedBy += value(c)
              Route.Reach.ByKey(c)
            }
            (reach, if (InputKind.isStored(kinds(to))) StoreIndex.single(p) else carried)
          case None =>
            placedBy.clear()
            if (!isTimeSliced(to)) placedBy += key(to, p)
            val lookup = if (!InputKind.isStored(kinds(to))) Some(carried)
              // (the slice class's one value: every row of the slice)
              else if (isTimeSliced(to) && value.contains(p)) Some(StoreIndex.single(p))
              else {
                val edge = classesOf(from) intersect classesOf(to)
                // An index on a class also serves a carried class whose key in `to` is the same
                // expression (see `choose`).
                ProbeSteps.usableIndexes(graph, to, indexes(to), value.contains)
                  .sortBy(ix => (!ix.classes.exists(edge.contains), -ix.classes.size)).headOption
              }
            (Route.Reach.AllPartitions, lookup.getOrElse(throw new IllegalStateException(
              s"UMJoin route ${route.order.mkString("->")}: input $to is reached from $from" +
                " by no index of its store")))
        }
      }
      // A matched row's keys equal the values it was found by: where one placed the combination,
      // they did too.
      classesOf(to).foreach(c => if (value.get(c).exists(placedBy.contains)) placedBy += key(to, c))
      bind(to)
      classesOf(to).foreach(c => if (placedBy.contains(key(to, c))) placedBy += value(c))
      step
    }
  }

  /** The indexes `route`'s steps probe in all partitions of a store (the ones a layout keeps). */
  private[streaming] def allPartitionLookups(graph: JoinGraph,
      route: Route): Seq[(Int, StoreIndex)] =
    route.order.tail.zip(reaches(graph, route))
      .collect { case (input, (Route.Reach.AllPartitions, index)) => (input, index) }

  /**
   * The probe steps this layout can run whatever was bound before, for the adaptive policies: into
   * a table indexed in memory through any shared class; into a store through its partitioning
   * class, or through an index all of whose classes the probing input carries itself.
   */
  def probeGraph(graph: JoinGraph): ProbeGraph = {
    val n = kinds.size
    ProbeGraph(n, for {
      from <- 0 until n
      to <- 0 until n
      shared = graph.classes.indices.filter(c => graph.classes(c).inputs.contains(from) &&
        graph.classes(c).inputs.contains(to))
      if from != to && shared.nonEmpty &&
        (!InputKind.isStored(kinds(to)) || partitionClass(to).exists(shared.contains) ||
          indexes(to).exists(_.classes.forall(shared.contains)))
    } yield (from, to))
  }

  /**
   * Whether `graph` (see [[probeGraph]]) has a route from every stream through all inputs: else an
   * adaptive policy has nothing to choose.
   */
  def routable(graph: ProbeGraph): Boolean = streams.forall { start =>
    val reached = scala.collection.mutable.Set(start)
    var grew = true
    while (grew) {
      val next =
        graph.edges.collect { case (f, t) if reached.contains(f) && !reached.contains(t) => t }
      grew = next.nonEmpty
      reached ++= next
    }
    reached.size == kinds.size
  }
}

object StreamingLayout {

  /**
   * The inputs whose rows live in state stores: the stored static tables, and the streams where
   * there are several (the only stream of a join with static tables keeps no row: no later row can
   * join it).
   */
  def storedOf(kinds: IndexedSeq[InputKind]): Seq[Int] = {
    val streams = kinds.count(_ == InputKind.Stream)
    kinds.indices.filter(i => kinds(i) == InputKind.StaticStored ||
      (kinds(i) == InputKind.Stream && streams > 1))
  }

  /**
   * Whether [[choose]] may spread input `i`'s store by time slice: a stream of a group of inner
   * joins with a span of event times, on a class of time slices only (whether that class is the
   * one chosen to partition it depends on the sizes).
   */
  def sliceable(graph: JoinGraph, kinds: IndexedSeq[InputKind], i: Int, partitions: Int,
      spanMs: Option[Long]): Boolean =
    kinds(i) == InputKind.Stream && partitions >= 2 && spanMs.isDefined &&
      graph.outer.isEmpty && graph.filters.isEmpty && graph.classes.exists(c =>
        c.inputs.contains(i) && isTimeSliceClass(c.members))

  private def isTimeSliceClass(members: Seq[(Int, Expression)]): Boolean = members.forall {
    case (_, TimeSlice(time)) => SliceWindow.isTimestamp(time.dataType)
    case _ => false
  }

  /**
   * The layout of least probe cost for a group: every partitioned input's class and every stream's
   * route from [[ProbeCost.optimize]]; a store (a stream's, a stored table's) is then indexed for
   * each step of a route that reaches it in all its partitions. With `compositeIndexes` such an
   * index covers every class of the store the combination carries there (one lookup finds exactly
   * the rows agreeing on all of them, where one class alone may find many that a later condition
   * drops: TPC-H Q9's lineitems of one supplier, 600 at SF 1, against 7.5 of one supplier and
   * part); otherwise it is on one class the route's edge shares, which any input sharing that class
   * can probe (what the adaptive policies need: they change routes within what the layout can
   * probe).
   */
  def choose(graph: JoinGraph, kinds: IndexedSeq[InputKind], sizes: JoinSizes, statistics: String,
      partitions: Int, compositeIndexes: Boolean, timeSpanMs: Int => Option[Long],
      slicesPerSpan: Int, stores: StoreLayout): StreamingLayout = {
    val n = kinds.size
    val classesOf =
      (0 until n).map(i => graph.classes.indices.filter(c => graph.classes(c).inputs.contains(i)))
    val candidates = (0 until n).map { i =>
      if (kinds(i) == InputKind.StaticBroadcast) Nil
      else classesOf(i).sortBy(c =>
        (-graph.classes(c).inputs.size, !isIntegral(graph.classes(c).members.head._2.dataType), c))
    }
    val costGraph = CostGraph(n, graph.classes.map(_.inputs).toIndexedSeq, candidates,
      kinds.indices.filter(kinds(_) == InputKind.Stream))
    val optimal = ProbeCost.optimize(costGraph, sizes, partitions)
    val choice = optimal.copy(routes = optimal.routes.map { case (start, route) =>
      start -> nonPreservedLast(graph, route)
    })
    // Every index a step could use; the routes' steps then pick theirs (the widest usable), and
    // only those are kept.
    val possible = classesOf.map { cs =>
      if (compositeIndexes)
        (1 to cs.size).flatMap(cs.combinations).map(StoreIndex(_)) else cs.map(StoreIndex.single)
    }
    val sliced = (0 until n).map { i =>
      val onSlices =
        choice.partitioning(i).exists(c => isTimeSliceClass(graph.classes(c).members))
      // `slicesPerSpan` slices over the event times a row's matches span (at least 1 ms each), on a
      // ring of all partitions. (Only in groups of inner joins: outer and semi joins' waiting
      // combinations are placed by their keys, untested with slices.)
      if (!onSlices || !sliceable(graph, kinds, i, partitions, timeSpanMs(i))) None
      else timeSpanMs(i).map(span =>
        TimeSlicing(slicesPerSpan, TimeSlicing.width(span, slicesPerSpan)))
    }
    val provisional = StreamingLayout(kinds, choice.partitioning, possible, choice.routes,
      choice.cost, statistics, sliced, stores)
    val indexes = (0 until n).map { i =>
      if (!InputKind.isStored(kinds(i))) Nil
      else {
        // (A semi join's stream starts no route: its rows only let combinations through.)
        val probed = choice.routes.values.toSeq.filterNot(
          route => graph.filters.contains(route.start)).flatMap { route =>
            provisional.allPartitionLookups(graph, route).collect { case (`i`, ix) => ix }
          }.distinct.filterNot(ix => choice.partitioning(i).map(StoreIndex.single).contains(ix))
            .sortBy(_.classes.mkString(","))
        // One index per key of the input: outer joins' ON keys are classes of their own, so several
        // joins on one column of it would each index that column. The first serves them all (`plan`
        // probes it with any carried class of the same expression). Not for an outer or semi join's
        // non-preserved input: it is probed by its own ON keys.
        if (graph.outer.contains(i) || graph.filters.contains(i)) probed
        else probed.distinctBy(_.classes.map(c => graph.classes(c).keyOf(i).get.canonicalized))
      }
    }
    provisional.copy(indexes = indexes)
  }

  /**
   * `route` with the non-preserved inputs of the outer and semi joins probed last (all but the one
   * the route starts at), the semi join's after the outer ones: everything their conditions read is
   * bound by then, and the rows bound before them are a whole combination of the preserved inputs
   * (the group's inner inputs), which each of them matches, pads with NULLs or lets through. The
   * other inputs keep their order where they can, each reached from an input before it (they are
   * connected without the non-preserved ones, or the group does not convert).
   */
  def nonPreservedLast(graph: JoinGraph, route: Route): Route = {
    // A semi join's input last of all: the combination it lets through, or hands to its waiting
    // store, is then whole. (Several in input order, lowest join first, as Spark applies them.)
    val semis = graph.filters.keys.toSeq.sorted.filter(_ != route.start)
    val moved = graph.outer.keys.toSeq.sorted.filter(_ != route.start) ++ semis
    val last = route.order.takeRight(moved.size)
    if (moved.isEmpty || last.sorted == moved.sorted && last.takeRight(semis.size) == semis &&
        isPreservedFirst(graph, route, moved)) route
    else {
      val shares =
        (a: Int, b: Int) => graph.classes.exists(c => c.inputs.contains(a) && c.inputs.contains(b))
      val placed = scala.collection.mutable.ArrayBuffer(route.start)
      val edges = scala.collection.mutable.ArrayBuffer[(Int, Int)]()
      var remaining = route.order.tail.filterNot(moved.contains)
      while (remaining.nonEmpty) {
        val next = remaining.find(r => placed.exists(shares(_, r)))
          .getOrElse(throw new IllegalStateException(
            s"UMJoin route ${route.order.mkString("->")}" +
              s": the preserved inputs of the joins of inputs ${moved.mkString(", ")}" +
              " are not connected without them"))
        val from = route.edges.collectFirst { case (f, `next`) if placed.contains(f) => f }
          .getOrElse(placed.find(shares(_, next)).get)
        edges += ((from, next))
        placed += next
        remaining = remaining.filter(_ != next)
      }
      // Each non-preserved input is probed from an input of its join's preserved side that shares
      // its key.
      val preserved = placed.toSet
      moved.foreach { o =>
        edges += ((graph.classes.filter(_.inputs.contains(o)).flatMap(_.inputs)
          .find(preserved.contains).get, o))
      }
      Route(route.start, edges.toSeq)
    }
  }

  /**
   * Whether every one of `moved` in `route` is probed from a preserved input (not from another of
   * them).
   */
  private def isPreservedFirst(graph: JoinGraph, route: Route, moved: Seq[Int]): Boolean =
    route.edges.forall { case (from, to) => !moved.contains(to) || !moved.contains(from) }

  private def isIntegral(t: DataType): Boolean =
    Seq(ByteType, ShortType, IntegerType, LongType).contains(t)
}

/**
 * A group's layout as its plan holds it: decided (read from the checkpoint, or chosen in an earlier
 * micro-batch of the run), or, on a new checkpoint, chosen by the operator when it first runs.
 */
sealed trait GroupLayout {
  def kinds: IndexedSeq[InputKind]
  def stores: StoreLayout
  /** Whether input `i`'s store is, or may be, spread by time slice. */
  def maySlice(i: Int): Boolean
  /** Whether input `i` is broadcast to every task (else placed in the state's partitions). */
  def broadcast(i: Int): Boolean
}

object GroupLayout {
  final case class Decided(layout: StreamingLayout) extends GroupLayout {
    override def kinds: IndexedSeq[InputKind] = layout.kinds
    override def stores: StoreLayout = layout.stores
    override def maySlice(i: Int): Boolean = layout.isTimeSliced(i)
    override def broadcast(i: Int): Boolean = layout.partitionClass(i).isEmpty
  }

  /**
   * A new checkpoint's layout, chosen from the first micro-batch's figures when the operator runs
   * it ([[FirstBatchStatistics]]): what planning knows is all [[StreamingLayout.choose]] needs but
   * the sizes, and Spark's plan estimates (`estimated`, said as `estimatedText`) serve where the
   * figures cannot be measured.
   */
  final case class FromFirstMicroBatch(
      kinds: IndexedSeq[InputKind],
      estimated: JoinSizes,
      estimatedText: String,
      partitions: Int,
      compositeIndexes: Boolean,
      timeSpansMs: IndexedSeq[Option[Long]],
      slicesPerSpan: Int,
      stores: StoreLayout,
      sliceable: IndexedSeq[Boolean]) extends GroupLayout {
    override def maySlice(i: Int): Boolean = sliceable(i)
    // (A layout partitions every input but the tables Spark would broadcast: see `choose`.)
    override def broadcast(i: Int): Boolean = kinds(i) == InputKind.StaticBroadcast

    /** The layout of least predicted probe cost for the sizes measured (None: not measured). */
    def chosen(graph: JoinGraph, measured: Option[JoinSizes]): StreamingLayout = {
      val (sizes, statistics) = measured.fold((estimated, estimatedText))(sizes =>
        (sizes, s"first micro-batch: rows [${sizes.rates.map(_.toLong).mkString(", ")}], " +
          s"key values [${sizes.distinct.map(_.toLong).mkString(", ")}]"))
      StreamingLayout.choose(graph, kinds, sizes, statistics, partitions, compositeIndexes,
        timeSpansMs, slicesPerSpan, stores)
    }
  }
}
