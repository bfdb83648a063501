package umjoin.spark.streaming

import org.json4s.JsonAST._
import org.json4s.jackson.JsonMethods.{compact, parse, render}

import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.types.{ByteType, DataType, IntegerType, LongType, ShortType}

import umjoin.spark.core.JoinGraph
import umjoin.spark.core.cost.{CostGraph, JoinSizes, ProbeCost, ProbeGraph, ProbeRoute}
import umjoin.spark.core.probe.StoreIndex

/** How an input of a streaming UMJoin takes part. */
sealed trait InputKind {
  /** As `explain()` and the checkpoint's layout record name it. */
  def name: String
}

object InputKind {
  /** Its rows arrive in micro-batches and are kept as state, in stores partitioned by one of its join keys. */
  case object Stream extends InputKind { override val name = "stream" }
  /** A batch table, broadcast to every task in every micro-batch, as Spark's stream-static join broadcasts it. */
  case object StaticBroadcast extends InputKind { override val name = "static broadcast" }
  /**
   * A batch table too large to broadcast whose rows cannot be known unchanged between micro-batches
   * (it reads a source other than files, or a nondeterministic expression): read and hash-partitioned
   * again in every micro-batch, as Spark's stream-static join does.
   */
  case object StaticPartitioned extends InputKind { override val name = "static" }
  /**
   * A batch table too large to broadcast, read from files: kept in stores partitioned and indexed
   * like a stream's, written when the query (re)starts and again only when the table changes
   * ([[umjoin.spark.streaming.StaticVersions]]); between, the micro-batches probe the stores and never read the table.
   */
  case object StaticStored extends InputKind { override val name = "static stored" }

  val byName: Map[String, InputKind] = Seq(Stream, StaticBroadcast, StaticPartitioned, StaticStored).map(k => k.name -> k).toMap

  /** Kinds whose rows live in the StreamingUMJoin's state stores. */
  def isStored(kind: InputKind): Boolean = kind == Stream || kind == StaticStored
}

/** How the partial combinations of a route reach the store probed next. */
sealed trait Reach

object Reach {
  /** They are in the right partition already: the store is partitioned on the class they are partitioned by. */
  case object Local extends Reach
  /** Shuffled to the one partition their value of `keyClass` (the store's partitioning class) hashes to. */
  final case class ByKey(keyClass: Int) extends Reach
  /** Sent to every partition: they do not carry the store's partitioning class yet (CLASH's chi). */
  case object AllPartitions extends Reach
}

/** One step of a route as it runs: how the combinations reach the store, and the index (key classes) the store is probed by. */
final case class RoutedStep(reach: Reach, lookup: StoreIndex)

/** Steps [from, until) of a route, run in one task; then the combinations move by `next` (None: they are complete rows). */
final case class Segment(from: Int, until: Int, next: Option[Reach])

/**
 * How a streaming UMJoin keeps and probes its inputs: per input its kind, the key class its rows
 * are hash-partitioned on (None for a broadcast table), the further indexes of a stream's store
 * (so that a row sent to all partitions finds its matches by keys it carries; an index on several
 * classes is one multi-column key), and the route of every stream's new rows. Chosen by the probe-cost model (paper 002, [[ProbeCost]]) when
 * a query starts on a new checkpoint, and read back from the checkpoint ever after: the state is
 * laid out by it. `statistics` says what the model's figures were (shown in `explain()`).
 */
final case class StreamingLayout(
    kinds: IndexedSeq[InputKind],
    partitionClass: IndexedSeq[Option[Int]],
    indexes: IndexedSeq[Seq[StoreIndex]],
    routes: Map[Int, ProbeRoute],
    predictedCost: Double,
    statistics: String) {

  def streams: Seq[Int] = kinds.indices.filter(kinds(_) == InputKind.Stream)

  /**
   * The inputs whose rows live in state stores: the stored static tables, and the streams where
   * there are several (the only stream of a join with static tables keeps no row: no later row can join it).
   */
  def stored: Seq[Int] = kinds.indices.filter(i => kinds(i) == InputKind.StaticStored || (kinds(i) == InputKind.Stream && streams.size > 1))

  /**
   * The steps of `route`: a store partitioned on a class the combination carries is reached in its
   * partition (in the same task when the combination is there already) and probed by that class;
   * any other store is reached in all partitions and probed by its widest index whose classes the
   * combination all carries (one through the route's edge where there is one). A static table
   * indexed in memory per batch is probed by every class of it the combination carries.
   */
  def steps(graph: JoinGraph, route: ProbeRoute): Seq[RoutedStep] = {
    def classesOf(input: Int): Set[Int] = graph.classes.indices.filter(graph.classes(_).inputs.contains(input)).toSet
    var bound = classesOf(route.start)
    var location = partitionClass(route.start)
    route.edges.map { case (from, to) =>
      val carried = StoreIndex((classesOf(to) intersect bound).toSeq.sorted)
      val step = partitionClass(to) match {
        case None => RoutedStep(Reach.Local, carried)
        case Some(p) if bound.contains(p) =>
          val reach = if (location.contains(p)) Reach.Local else Reach.ByKey(p)
          location = Some(p)
          RoutedStep(reach, if (InputKind.isStored(kinds(to))) StoreIndex.single(p) else carried)
        case Some(p) =>
          location = Some(p)
          val lookup = if (!InputKind.isStored(kinds(to))) Some(carried) else {
            val edge = classesOf(from) intersect classesOf(to)
            indexes(to).filter(_.classes.forall(bound.contains)).sortBy(ix => (!ix.classes.exists(edge.contains), -ix.classes.size)).headOption
          }
          RoutedStep(Reach.AllPartitions, lookup.getOrElse(throw new IllegalStateException(
            s"UMJoin route ${route.order.mkString("->")}: input $to is reached from $from by no index of its store")))
      }
      bound ++= classesOf(to)
      step
    }
  }

  /** A route's steps cut where the combinations move to other partitions. */
  def segments(steps: Seq[RoutedStep]): Seq[Segment] = {
    // A route whose first step leaves the partition starts with an empty segment: the row is shipped as it is.
    val bounds = 0 +: steps.indices.filter(t => steps(t).reach != Reach.Local) :+ steps.size
    bounds.zip(bounds.tail).map { case (from, until) => Segment(from, until, if (until < steps.size) Some(steps(until).reach) else None) }
  }

  /**
   * The probe steps this layout can run whatever was bound before, for the adaptive policies: into a
   * table indexed in memory through any shared class; into a store through its partitioning class, or
   * through an index all of whose classes the probing input carries itself.
   */
  def probeGraph(graph: JoinGraph): ProbeGraph = {
    val n = kinds.size
    ProbeGraph(n, for {
      from <- 0 until n
      to <- 0 until n
      shared = graph.classes.indices.filter(c => graph.classes(c).inputs.contains(from) && graph.classes(c).inputs.contains(to))
      if from != to && shared.nonEmpty && (!InputKind.isStored(kinds(to)) || partitionClass(to).exists(shared.contains) ||
        indexes(to).exists(_.classes.forall(shared.contains)))
    } yield (from, to))
  }

  /** Whether `graph` (see [[probeGraph]]) has a route from every stream through all inputs: else an adaptive policy has nothing to choose. */
  def routable(graph: ProbeGraph): Boolean = streams.forall { start =>
    val reached = scala.collection.mutable.Set(start)
    var grew = true
    while (grew) {
      val next = graph.edges.collect { case (f, t) if reached.contains(f) && !reached.contains(t) => t }
      grew = next.nonEmpty
      reached ++= next
    }
    reached.size == kinds.size
  }
}

object StreamingLayout {

  /**
   * The version of the state's layout this code writes; it reads this one and the ones before
   * (format 1: single-class indexes; format 2: no stored static tables).
   */
  val Format = 3

  /**
   * The layout of least probe cost for a group: every partitioned input's class and every stream's
   * route from [[ProbeCost.optimize]]; a store (a stream's, a stored table's) is then indexed for each step of a route
   * that reaches it in all its partitions. With `compositeIndexes` such an index covers every class
   * of the store the combination carries there (one lookup finds exactly the rows agreeing on all
   * of them, where one class alone may find many that a later condition drops: TPC-H Q9's lineitems
   * of one supplier, 600 at SF 1, against 7.5 of one supplier and part); otherwise it is on one
   * class the route's edge shares, which any input sharing that class can probe (what the adaptive
   * policies need: they change routes within what the layout can probe).
   */
  def choose(graph: JoinGraph, kinds: IndexedSeq[InputKind], sizes: JoinSizes, statistics: String, partitions: Int,
      compositeIndexes: Boolean): StreamingLayout = {
    val n = kinds.size
    val classesOf = (0 until n).map(i => graph.classes.indices.filter(c => graph.classes(c).inputs.contains(i)))
    val candidates = (0 until n).map { i =>
      if (kinds(i) == InputKind.StaticBroadcast) Nil
      else classesOf(i).sortBy(c => (-graph.classes(c).inputs.size, !isIntegral(graph.classes(c).members.head._2.dataType), c))
    }
    val costGraph = CostGraph(n, graph.classes.map(_.inputs).toIndexedSeq, candidates, kinds.indices.filter(kinds(_) == InputKind.Stream))
    val optimal = ProbeCost.optimize(costGraph, sizes, partitions)
    val choice = optimal.copy(routes = optimal.routes.map { case (start, route) => start -> nonPreservedLast(graph, route) })
    // Every index a step could use; the routes' steps then pick theirs (the widest usable), and only those are kept.
    val possible = classesOf.map { cs =>
      if (compositeIndexes) (1 to cs.size).flatMap(cs.combinations).map(StoreIndex(_)) else cs.map(StoreIndex.single)
    }
    val provisional = StreamingLayout(kinds, choice.partitioning, possible, choice.routes, choice.cost, statistics)
    val indexes = (0 until n).map { i =>
      if (!InputKind.isStored(kinds(i))) Nil
      // (A semi join's stream starts no route: its rows only let combinations through.)
      else choice.routes.values.toSeq.filterNot(route => graph.filters.contains(route.start)).flatMap { route =>
        route.order.tail.zip(provisional.steps(graph, route)).collect { case (`i`, RoutedStep(Reach.AllPartitions, ix)) => ix }
      }.distinct.sortBy(_.classes.mkString(","))
    }
    provisional.copy(indexes = indexes)
  }

  /**
   * `route` with the outer or semi join's non-preserved input probed last (unless the route starts
   * there): everything its condition reads is bound by then, and the rows bound before it are a
   * whole combination of the preserved inputs, which waits in that input's partition for a match
   * where none is stored yet. The other inputs keep their order where they can, each reached from
   * an input before it (they are connected without it, or the group does not convert).
   */
  def nonPreservedLast(graph: JoinGraph, route: ProbeRoute): ProbeRoute = (graph.outer.keys ++ graph.filters.keys).headOption match {
    case Some(o) if o != route.start && route.order.last != o =>
      val shares = (a: Int, b: Int) => graph.classes.exists(c => c.inputs.contains(a) && c.inputs.contains(b))
      val placed = scala.collection.mutable.ArrayBuffer(route.start)
      val edges = scala.collection.mutable.ArrayBuffer[(Int, Int)]()
      var remaining = route.order.tail.filter(_ != o)
      while (remaining.nonEmpty) {
        val next = remaining.find(r => placed.exists(shares(_, r))).getOrElse(throw new IllegalStateException(
          s"UMJoin route ${route.order.mkString("->")}: the preserved inputs of the join of input $o are not connected without it"))
        val from = route.edges.collectFirst { case (f, `next`) if placed.contains(f) => f }.getOrElse(placed.find(shares(_, next)).get)
        edges += ((from, next))
        placed += next
        remaining = remaining.filter(_ != next)
      }
      val onFrom = graph.classes.filter(_.inputs.contains(o)).flatMap(_.inputs).find(i => i != o && placed.contains(i)).get
      ProbeRoute(route.start, edges.toSeq :+ ((onFrom, o)))
    case _ => route
  }

  private def isIntegral(t: DataType): Boolean = Seq(ByteType, ShortType, IntegerType, LongType).contains(t)

  /** The layout as the checkpoint keeps it: classes named by each input's key expression, so they are found again after a restart. */
  def toJson(layout: StreamingLayout, graph: JoinGraph, inputs: Seq[Seq[Attribute]], labels: Seq[String]): String = {
    def key(input: Int, c: Int): JValue = JString(keyName(graph, input, c))
    val inputJson = inputs.indices.map { i =>
      JObject(List[JField](
        "label" -> JString(labels(i)),
        "kind" -> JString(layout.kinds(i).name),
        "columns" -> JArray(columns(inputs(i)).map(JString(_)).toList),
        "partitionedBy" -> layout.partitionClass(i).map(key(i, _)).getOrElse(JNull),
        "indexedBy" -> JArray(layout.indexes(i).map(ix => JArray(ix.classes.map(key(i, _)).toList)).toList)) ++
        (if (graph.outer.contains(i)) List[JField]("joinType" -> JString(OuterJoinType)) else Nil))
    }
    val routeJson = layout.routes.toSeq.sortBy(_._1).map { case (start, route) =>
      JObject("start" -> JInt(start), "edges" -> JArray(route.edges.map { case (f, t) => JArray(List(JInt(f), JInt(t))) }.toList))
    }
    compact(render(JObject(
      "format" -> JInt(Format),
      "inputs" -> JArray(inputJson.toList),
      "routes" -> JArray(routeJson.toList),
      "predictedProbeCost" -> JDouble(layout.predictedCost),
      "statistics" -> JString(layout.statistics))))
  }

  /** The layout recorded in a checkpoint, or why it does not fit this group (another query, other columns, other keys). */
  def fromJson(text: String, graph: JoinGraph, inputs: Seq[Seq[Attribute]]): Either[String, StreamingLayout] =
    try Right(read(text, graph, inputs)) catch { case m: LayoutMismatch => Left(m.getMessage) }

  private final class LayoutMismatch(reason: String) extends Exception(reason)

  private def read(text: String, graph: JoinGraph, inputs: Seq[Seq[Attribute]]): StreamingLayout = {
    def fail(reason: String): Nothing = throw new LayoutMismatch(reason)
    val json = try parse(text) catch { case e: Exception => fail(s"its layout record cannot be read (${e.getMessage})") }
    json \ "format" match {
      case JInt(f) if f >= 1 && f <= Format =>
      case JInt(f) => fail(s"it was written by another version of UMJoin (state layout format $f; this version reads formats 1 to $Format)")
      case _ => fail("its layout record has no format")
    }
    val recorded = json \ "inputs" match {
      case JArray(items) => items
      case _ => fail("its layout record has no inputs")
    }
    if (recorded.size != inputs.size) fail(s"it was written for a join of ${recorded.size} inputs, this one has ${inputs.size}")
    def classOf(input: Int, key: String): Int =
      graph.classes.indices.find(c => graph.classes(c).keyOf(input).isDefined && keyName(graph, input, c) == key)
        .getOrElse(fail(s"input #$input was stored by $key, which this join does not join it on"))
    val parsed = recorded.zipWithIndex.map { case (item, i) =>
      val kind = item \ "kind" match {
        case JString(k) => InputKind.byName.getOrElse(k, fail(s"input #$i has an unknown kind $k"))
        case _ => fail(s"input #$i has no kind in its layout record")
      }
      val cols = item \ "columns" match {
        case JArray(cs) => cs.collect { case JString(c) => c }
        case _ => Nil
      }
      if (cols != columns(inputs(i))) fail(s"input #$i had columns (${cols.mkString(", ")}), now (${columns(inputs(i)).mkString(", ")})")
      val partition = item \ "partitionedBy" match {
        case JString(k) => Some(classOf(i, k))
        case _ => None
      }
      // Format 1 recorded an index as its one key; format 2 as the list of its keys.
      val indexes = item \ "indexedBy" match {
        case JArray(ixs) => ixs.collect {
          case JString(k) => StoreIndex.single(classOf(i, k))
          case JArray(ks) => StoreIndex(ks.collect { case JString(k) => classOf(i, k) })
        }
        case _ => Nil
      }
      val joinType = item \ "joinType" match {
        case JString(t) => t
        case _ => "inner"
      }
      val current = if (graph.outer.contains(i)) OuterJoinType else "inner"
      if (joinType != current) fail(s"input #$i was joined as $joinType, now as $current")
      (kind, partition, indexes)
    }.toIndexedSeq
    val routes = json \ "routes" match {
      case JArray(items) => items.map { item =>
        val start = item \ "start" match {
          case JInt(s) => s.toInt
          case _ => fail("a recorded route has no start")
        }
        val edges = item \ "edges" match {
          case JArray(es) => es.collect { case JArray(List(JInt(f), JInt(t))) => (f.toInt, t.toInt) }
          case _ => Nil
        }
        start -> ProbeRoute(start, edges)
      }.toMap
      case _ => fail("its layout record has no routes")
    }
    val cost = json \ "predictedProbeCost" match {
      case JDouble(c) => c
      case JInt(c) => c.toDouble
      case _ => 0.0
    }
    val statistics = json \ "statistics" match {
      case JString(text) => text
      case _ => "not recorded"
    }
    val layout = StreamingLayout(parsed.map(_._1), parsed.map(_._2), parsed.map(_._3), routes, cost, statistics)
    layout.streams.find(s => !routes.get(s).exists(_.order.sorted == inputs.indices)).foreach { s =>
      fail(s"its recorded probe routes do not fit this join (none from input #$s through all ${inputs.size} inputs)")
    }
    // A semi join's stream starts no route (its rows only let combinations through): its recorded route is never probed.
    routes.values.filterNot(r => graph.filters.contains(r.start)).foreach { r =>
      scala.util.Try(layout.steps(graph, r)).failed.foreach(e => fail(s"its recorded probe routes do not fit this join (route ${r.order.mkString(" -> ")}: ${e.getMessage})"))
    }
    layout
  }

  /**
   * How the layout record names input `input`'s key for class `c`: its expression; for an outer
   * join's ON key (a class of its own, whose expression of the other input may be in another class
   * too), followed by `ON` and the outer input's expression.
   */
  private def keyName(graph: JoinGraph, input: Int, c: Int): String = {
    val expression = graph.classes(c).keyOf(input).get.sql
    graph.outer.keys.find(o => o != input && graph.classes(c).inputs.contains(o))
      .fold(expression)(o => s"$expression ON ${graph.classes(c).keyOf(o).get.sql}")
  }

  /** How the layout record names an outer join's non-preserved input (the others are inner, and not named: older records read the same). */
  private val OuterJoinType = "left outer"

  private def columns(attributes: Seq[Attribute]): List[String] = attributes.map(a => s"${a.name} ${a.dataType.catalogString}").toList
}
