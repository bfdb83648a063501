package umjoin.spark.streaming

import java.nio.charset.StandardCharsets

import org.json4s.JsonAST._
import org.json4s.jackson.JsonMethods.{compact, parse, render}

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileSystem, Path}

import org.apache.spark.sql.catalyst.expressions.Attribute
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.state.{OperatorStateMetadata,
  OperatorStateMetadataUtils, OperatorStateMetadataV1, OperatorStateMetadataV1Reader,
  OperatorStateMetadataV2}

import umjoin.spark.core.JoinGraph
import umjoin.spark.core.probe.{Route, StoreIndex}

/**
 * A StreamingUMJoin's own files in its query's checkpoint, all read and written here: the record of
 * its state's layout (`<checkpoint>/state/<operator>/_umjoin_layout.json`, beside its stores), its
 * format, the changes of its time slicing (`_umjoin_slices_<batch>.json`, one per micro-batch that
 * changed it), and what the stores there say about who wrote them. The rule asks it whether a group
 * can continue the state it finds; the operator records the layout when its state starts.
 */
final class OperatorCheckpoint(info: StatefulOperatorStateInfo, hadoopConf: Configuration) {
  import OperatorCheckpoint._

  /** Where the layout is recorded. */
  val layoutFile: Path =
    new Path(info.checkpointLocation, s"${info.operatorId}/_umjoin_layout.json")
  private lazy val fs = layoutFile.getFileSystem(hadoopConf)
  private def partition0 = new Path(layoutFile.getParent, "0")

  def hasLayout: Boolean = fs.exists(layoutFile)

  /**
   * Spark's metadata of the operator replaced by `metadata`, atomically. Spark writes it once per
   * checkpoint, when it plans the first micro-batch; a StreamingUMJoin that chose its layout (and
   * so its stores) after that writes it again.
   */
  def rewriteOperatorMetadata(metadata: OperatorStateMetadata): Unit = {
    val file = OperatorStateMetadataV1.metadataFilePath(layoutFile.getParent)
    val out = CheckpointFileManager.create(file.getParent, hadoopConf)
      .createAtomic(file, overwriteIfPossible = true)
    OperatorStateMetadataUtils.writeMetadata(out, metadata, file)
  }

  /**
   * Stores of a StreamingUMJoin written before layouts were recorded: in partition 0, named
   * umjoin-input-<i>.
   */
  def hasStoresWithoutLayout: Boolean =
    !hasLayout && fs.exists(partition0) &&
      fs.listStatus(partition0).exists(_.getPath.getName.startsWith("umjoin-input-"))

  /**
   * Stores of combinations an outer join waited to match, which versions before chained outer joins
   * kept (umjoin-unmatched-<i>).
   */
  def hasUnmatchedStores(outerInputs: Set[Int]): Boolean =
    fs.exists(partition0) && fs.listStatus(partition0)
      .exists(f => outerInputs.exists(o => f.getPath.getName == InputState.unmatchedStoreName(o)))

  /**
   * Whether a StreamingUMJoin's state is here (recorded layout, or stores of an earlier version).
   */
  def hasUMJoinState: Boolean = hasLayout || hasStoresWithoutLayout

  /**
   * Whether Spark's stream-stream join kept its state here: no StreamingUMJoin's, and a store with
   * files beside its schema (which Spark writes for every planned join's stores, converted or not),
   * other than a StreamingUMJoin's one store per partition.
   */
  def hasSparkJoinState: Boolean = !hasUMJoinState && fs.exists(partition0) &&
    fs.listStatus(partition0).filter(_.isDirectory)
      .filter(_.getPath.getName != InputState.PartitionStoreName)
      .exists(store => fs.listStatus(store.getPath).exists(_.getPath.getName != "_metadata"))

  /**
   * Whether the operator committed its stores in the previous micro-batch (so this one can read
   * them): the first stored input's store in partition 0 has a file of this batch's version, as
   * both Spark providers name them (`<version>.delta`, `<version>.zip`, `<version>.changelog`,
   * `<version>_<id>.zip`).
   */
  def committedBefore: Boolean =
    fs.exists(partition0) && fs.listStatus(partition0).filter(_.isDirectory).exists { store =>
      fs.listStatus(store.getPath)
        .exists(f => f.getPath.getName.startsWith(s"${info.storeVersion}.") ||
          f.getPath.getName.startsWith(s"${info.storeVersion}_"))
    }

  /** The layout record's text (None: not yet), or why it cannot be read, said for people. */
  def layoutRecord: Either[String, Option[String]] =
    if (!fs.exists(layoutFile)) Right(None)
    else try Right(Some(textOf(layoutFile))) catch {
      case e: java.io.IOException =>
        Left(refusal(s"its layout record $layoutFile cannot be read (${e.getMessage})"))
    }

  /**
   * The layout the record's text gives for this group (None: no record yet), or why this group
   * cannot continue its state, said for people.
   */
  def layoutOf(record: Option[String], graph: JoinGraph,
      outputs: Seq[Seq[Attribute]]): Either[String, Option[StreamingLayout]] =
    record match {
      case None => Right(None)
      case Some(text) =>
        fromJson(text, graph, outputs, info.numPartitions).map(Some(_)).left.map(refusal)
    }

  /**
   * Records the layout when the operator's state starts (the first batch); later batches find it
   * there. The record's text, as written now or before.
   */
  def recordLayout(layout: StreamingLayout, graph: JoinGraph, outputs: Seq[Seq[Attribute]],
      labels: Seq[String]): String =
    if (fs.exists(layoutFile)) textOf(layoutFile)
    else {
      val text = toJson(layout, graph, outputs, labels)
      write(layoutFile, text)
      text
    }

  /**
   * Records the layout of a StreamingUMJoin that takes the state of Spark's joins over (their
   * operator ids `replaced`), in place of any record an earlier try left. Until Spark's metadata
   * of the operator names it ([[finishTakeOver]]), the record is a take-over's that may not have
   * finished, which a restart runs again.
   */
  def recordTakeOver(layout: StreamingLayout, graph: JoinGraph, outputs: Seq[Seq[Attribute]],
      labels: Seq[String], replaced: Seq[Long]): String = {
    val text = compact(render(parse(toJson(layout, graph, outputs, labels)) merge
      JObject(TakeOverField -> JArray(replaced.map(JInt(_)).toList))))
    if (fs.exists(layoutFile)) fs.delete(layoutFile, false)
    write(layoutFile, text)
    text
  }

  /** Whether the layout record is a take-over's of Spark's joins' state. */
  def takesOverSparkJoins: Boolean =
    layoutRecord.toOption.flatten.exists(text => (parse(text) \ TakeOverField) != JNothing)

  /**
   * The last steps of a take-over of Spark's joins' state, once the StreamingUMJoin's stores hold
   * it: Spark's metadata of the other joins removed (so Spark's restart check finds no operator
   * the plan lacks), this operator's replaced by `metadata` (the take-over's commit: a restart now
   * continues the StreamingUMJoin), then the joins' state moved out of the state directory to
   * `<checkpoint>/umjoin/taken-over-<version>`, where nothing reads it. A restart between two
   * steps either runs Spark's joins and takes over again, or continues the StreamingUMJoin.
   */
  def finishTakeOver(replaced: Seq[Long], metadata: OperatorStateMetadata): Path = {
    val state = layoutFile.getParent.getParent
    val operator = layoutFile.getParent
    replaced.foreach(id => fs.delete(new Path(state, s"$id/_metadata"), true))
    val away = new Path(state.getParent, s"umjoin/taken-over-${info.storeVersion}")
    val own = new Path(away, info.operatorId.toString)
    // Spark's join's own metadata of version 2 and state schema (formats 3 and 4).
    moveAway(OperatorStateMetadataV2.metadataDirPath(operator), new Path(own, "_metadata/v2"))
    moveAway(new Path(operator, "_stateSchema"), new Path(own, "_stateSchema"))
    rewriteOperatorMetadata(metadata)
    replaced.foreach(id => moveAway(new Path(state, id.toString), new Path(away, id.toString)))
    moveStores(_ != InputState.PartitionStoreName, own)
    away
  }

  /**
   * Marks the layout record as one whose state Spark's joins are taking back (the take-back's
   * first step: a record so marked is not refused as an earlier UMJoin version's when the
   * checkpoint's metadata already names Spark's join, a take-back a restart interrupted).
   */
  def markTakeBack(): Unit = if (!takenBack) {
    val text = compact(render(parse(textOf(layoutFile)) merge
      JObject(TakeBackField -> JInt(info.storeVersion))))
    fs.delete(layoutFile, false)
    write(layoutFile, text)
  }

  /** Whether the layout record is one whose state Spark's joins took (or are taking) back. */
  def takenBack: Boolean =
    layoutRecord.toOption.flatten.exists(text => (parse(text) \ TakeBackField) != JNothing)

  /** Where a take-back in this micro-batch moves the StreamingUMJoin's files. */
  def awayForTakeBack(): Path = new Path(layoutFile.getParent.getParent.getParent,
    s"umjoin/taken-back-${info.storeVersion}/${info.operatorId}")

  /**
   * The StreamingUMJoin's state schema moved to `away` (before Spark's join writes its own there,
   * which Spark would check against the StreamingUMJoin's).
   */
  def moveSchemaAway(away: Path): Unit =
    moveAway(new Path(layoutFile.getParent, "_stateSchema"), new Path(away, "_stateSchema"))

  /**
   * The StreamingUMJoin's metadata file (version 1) moved to `away`, once Spark's join wrote its
   * own of version 2 (join state formats 3 and 4) beside it.
   */
  def moveMetadataV1Away(away: Path): Unit =
    moveAway(OperatorStateMetadataV1.metadataFilePath(layoutFile.getParent),
      new Path(away, "_metadata/metadata"))

  /**
   * All of the StreamingUMJoin's metadata moved to `away`: where Spark's joins keep no state (a
   * stream joined with static tables), the take-back's commit point.
   */
  def moveMetadataAway(away: Path): Unit =
    moveAway(new Path(layoutFile.getParent, "_metadata"), new Path(away, "_metadata"))

  /**
   * The take-back's last step: the StreamingUMJoin's stores, layout record and time slicing
   * records moved to `away`, where nothing reads them.
   */
  def moveStoresAway(away: Path): Unit = {
    val operator = layoutFile.getParent
    for (file <- fs.listStatus(operator) if file.getPath.getName.startsWith("_umjoin_")) {
      moveAway(file.getPath, new Path(away, file.getPath.getName))
    }
    moveStores(_ == InputState.PartitionStoreName, away)
  }

  /** The operator's stores (in its partitions' directories) whose names `moved` picks, to `to`. */
  private def moveStores(moved: String => Boolean, to: Path): Unit =
    for (partition <- fs.listStatus(layoutFile.getParent).filter(_.isDirectory)
         if partition.getPath.getName.toIntOption.isDefined;
         store <- fs.listStatus(partition.getPath)
         if store.isDirectory && moved(store.getPath.getName)) {
      val name = s"${partition.getPath.getName}/${store.getPath.getName}"
      moveAway(store.getPath, new Path(to, name))
    }

  private def moveAway(path: Path, to: Path): Unit = if (fs.exists(path)) {
    fs.mkdirs(to.getParent)
    fs.rename(path, to)
  }

  /**
   * The file recording the time slicing micro-batch `version` changed to (files are never
   * overwritten: not every file system can).
   */
  private def slicingFile(version: Long) =
    new Path(layoutFile.getParent, s"_umjoin_slices_$version.json")

  /**
   * The time slicing last recorded at or before micro-batch `version` (a change: see
   * [[StreamingLayout.resliced]]) and the micro-batch that recorded it; None where it never
   * changed.
   */
  def recordedSlicing(version: Long): Option[(Long, IndexedSeq[Option[TimeSlicing]])] = {
    val Recorded = "_umjoin_slices_(\\d+)\\.json".r
    val versions = fs.listStatus(layoutFile.getParent).map(_.getPath.getName)
      .collect { case Recorded(v) => v.toLong }.filter(_ <= version)
    versions.maxOption.map(v => v -> slicingFromJson(parse(textOf(slicingFile(v)))))
  }

  /**
   * Records that micro-batch `version` changed the time slicing to the layout's (once: a re-run of
   * the batch reads it back), given the change `recorded` last; returns the last change recorded
   * now.
   */
  def recordSlicing(version: Long, layout: StreamingLayout,
      recorded: Option[(Long, IndexedSeq[Option[TimeSlicing]])])
      : Option[(Long, IndexedSeq[Option[TimeSlicing]])] =
    if (recorded.exists(_._1 == version) ||
        recorded.map(_._2).getOrElse(recordedLayoutSlicing) == layout.timeSlices) recorded
    else {
      write(slicingFile(version),
        compact(render(JArray(layout.timeSlices.map(slicingJson).toList))))
      Some((version, layout.timeSlices))
    }

  /** The time slicing the layout record was written with. */
  private def recordedLayoutSlicing: IndexedSeq[Option[TimeSlicing]] =
    parse(textOf(layoutFile)) \ "inputs" match {
      case JArray(items) => items.map(item => timeSlicing(item, info.numPartitions)).toIndexedSeq
      case _ => IndexedSeq.empty
    }

  private def textOf(path: Path): String = OperatorCheckpoint.textOf(fs, path)

  private def write(path: Path, text: String): Unit = {
    val files = CheckpointFileManager.create(path.getParent, hadoopConf)
    // A new operator's directory does not exist before its stores first commit, and Spark's default
    // manager (FileContext's) creates no parent of a file.
    files.mkdirs(path.getParent)
    val out = files.createAtomic(path, overwriteIfPossible = false)
    try out.write(text.getBytes(StandardCharsets.UTF_8)) catch {
      case e: Throwable =>
        out.cancel()
        throw e
    }
    out.close()
  }

  /** Why this query cannot continue the operator's state, with what to do. */
  def refusal(reason: String): String = s"The checkpoint ${info.checkpointLocation} holds " +
    "StreamingUMJoin state for operator " +
    s"${info.operatorId} that this query cannot continue: $reason. Restart the query the " +
    "checkpoint was written for, or use a new checkpoint location."
}

object OperatorCheckpoint {

  /** The layout record's field naming the operators of Spark's joins it took over. */
  private val TakeOverField = "tookOverSparkJoins"
  /** The layout record's field naming the micro-batch in which Spark's joins took it back. */
  private val TakeBackField = "takenBackBySparkJoins"

  /** A checkpoint file's text (the stream closed after reading). */
  private[streaming] def textOf(fs: FileSystem, path: Path): String = {
    val in = fs.open(path)
    try new String(in.readAllBytes(), StandardCharsets.UTF_8) finally in.close()
  }

  /**
   * The stateful operators Spark's metadata of a query's state (`stateLocation`, the checkpoint's
   * `state` directory) names, by id: what Spark's own restart check compares a plan with.
   */
  def operatorsIn(stateLocation: String, hadoopConf: Configuration): Map[Long, String] = {
    val state = new Path(stateLocation)
    val fs = state.getFileSystem(hadoopConf)
    if (!fs.exists(state)) Map.empty
    else fs.listStatus(state).toSeq.filter(_.isDirectory)
      .flatMap(d => d.getPath.getName.toLongOption.map(_ -> d.getPath))
      .flatMap { case (id, path) => operatorName(fs, path, hadoopConf).map(id -> _) }.toMap
  }

  /**
   * The operator's name as Spark's metadata of it says: the file of metadata version 1 (Spark's
   * joins of state formats 1 and 2, UMJoin's), else the newest of version 2 (formats 3 and 4: one
   * per micro-batch that changed it, a version line then JSON).
   */
  private def operatorName(fs: FileSystem, operator: Path,
      hadoopConf: Configuration): Option[String] = {
    val v2 = OperatorStateMetadataV2.metadataDirPath(operator)
    if (fs.exists(OperatorStateMetadataV1.metadataFilePath(operator))) {
      new OperatorStateMetadataV1Reader(operator, hadoopConf).read()
        .map(_.operatorInfo.operatorName)
    } else if (fs.exists(v2)) {
      fs.listStatus(v2).flatMap(f => f.getPath.getName.toLongOption.map(_ -> f.getPath))
        .maxByOption(_._1).flatMap { case (_, file) =>
          textOf(fs, file).linesIterator.drop(1).mkString("\n") match {
            case "" => None
            case json => parse(json) \ "operatorInfo" \ "operatorName" match {
              case JString(name) => Some(name)
              case _ => None
            }
          }
        }
    } else None
  }

  /**
   * The version of the state's layout this code writes; it reads this one and the ones before
   * (format 1: single-class indexes; format 2: no stored static tables; format 3 and before:
   * separate stores, [[StoreLayout.Separate]]; format 4: an entry per row,
   * [[StoreLayout.ColumnFamilies]], where RocksDB keeps the state).
   */
  val Format = 5

  /**
   * The layout as the checkpoint keeps it: classes named by each input's key expression, so they
   * are found again after a restart.
   */
  /**
   * How a layout record says its stores are kept (a record of format 3 or before says nothing: a
   * store of its own each), or the name it gives that this version does not know.
   */
  private[streaming] def storesOf(record: JValue): Either[String, StoreLayout] =
    record \ "stores" match {
      case JString(name) => StoreLayout.byName.get(name).toRight(name)
      case _ => Right(StoreLayout.Separate)
    }

  private[streaming] def toJson(layout: StreamingLayout, graph: JoinGraph,
      inputs: Seq[Seq[Attribute]], labels: Seq[String]): String = {
    def key(input: Int, c: Int): JValue = JString(keyName(graph, input, c))
    val inputJson = inputs.indices.map { i =>
      JObject(List[JField](
        "label" -> JString(labels(i)),
        "kind" -> JString(layout.kinds(i).name),
        "columns" -> JArray(columns(inputs(i)).map(JString(_)).toList),
        "partitionedBy" -> layout.partitionClass(i).map(key(i, _)).getOrElse(JNull),
        "indexedBy" ->
          JArray(layout.indexes(i).map(ix => JArray(ix.classes.map(key(i, _)).toList)).toList)) ++
        (slicingJson(layout.timeSlices(i)) match {
          case JObject(fields) => fields
          case _ => Nil
        }) ++
        (if (graph.outer.contains(i)) List[JField]("joinType" -> JString(OuterJoinType)) else Nil))
    }
    val routeJson = layout.routes.toSeq.sortBy(_._1).map { case (start, route) =>
      JObject("start" -> JInt(start),
        "edges" -> JArray(route.edges.map { case (f, t) => JArray(List(JInt(f), JInt(t))) }.toList))
    }
    compact(render(JObject(
      "format" -> JInt(Format),
      "inputs" -> JArray(inputJson.toList),
      "routes" -> JArray(routeJson.toList),
      "predictedProbeCost" -> JDouble(layout.predictedCost),
      "statistics" -> JString(layout.statistics),
      "stores" -> JString(layout.stores.name))))
  }

  /**
   * An input's time slicing as the records keep it (fields of its entry in the layout record; an
   * object of its own in a change's): the width new event times are cut by, the count, and every
   * stretch [from µs, width ms, first slice]; `earlierTimeSliceMs` only as read from a version
   * before stretches.
   */
  private def slicingJson(slicing: Option[TimeSlicing]): JValue =
    JObject(slicing.toList.flatMap { t =>
      List[JField]("timeSliceMs" -> JInt(t.widthMs), "timeSlices" -> JInt(t.slices),
        "timeSliceStretches" -> JArray(t.stretches.map(s =>
          JArray(List(JInt(s.fromMicros), JInt(s.widthMs), JInt(s.firstSlice)))).toList)) ++
        (if (t.earlierWidthsMs.isEmpty) Nil else List[JField](
          "earlierTimeSliceMs" -> JArray(t.earlierWidthsMs.map(JInt(_)).toList)))
    })

  /**
   * An input's time slicing read from its record. Records written before stretches have the width
   * only (slices of it from the epoch); before the count was chosen, not the count (a slice per
   * partition).
   */
  private def timeSlicing(item: JValue, partitions: Int): Option[TimeSlicing] =
    item \ "timeSliceMs" match {
      case JInt(ms) =>
        val slices = item \ "timeSlices" match {
          case JInt(n) => n.toInt
          case _ => partitions
        }
        val earlier = item \ "earlierTimeSliceMs" match {
          case JArray(ws) => ws.collect { case JInt(w) => w.toLong }
          case _ => Nil
        }
        val stretches = item \ "timeSliceStretches" match {
          case JArray(all) =>
            all.collect { case JArray(List(JInt(from), JInt(width), JInt(first))) =>
              SliceStretch(from.toLong, width.toLong, first.toLong)
            }
          case _ => Nil
        }
        Some(TimeSlicing(slices,
          if (stretches.isEmpty) TimeSlicing(slices, ms.toLong).stretches else stretches, earlier))
      case _ => None
    }

  private def slicingFromJson(json: JValue): IndexedSeq[Option[TimeSlicing]] = json match {
    case JArray(items) => items.map(timeSlicing(_, 0)).toIndexedSeq
    case _ => IndexedSeq.empty
  }

  /**
   * The layout recorded in a checkpoint, or why it does not fit this group (another query, other
   * columns, other keys).
   */
  private[streaming] def fromJson(text: String, graph: JoinGraph, inputs: Seq[Seq[Attribute]],
      partitions: Int): Either[String, StreamingLayout] =
    try Right(read(text, graph, inputs, partitions))
    catch { case m: LayoutMismatch => Left(m.getMessage) }

  private final class LayoutMismatch(reason: String) extends Exception(reason)

  private def read(text: String, graph: JoinGraph, inputs: Seq[Seq[Attribute]],
      partitions: Int): StreamingLayout = {
    def fail(reason: String): Nothing = throw new LayoutMismatch(reason)
    val json = try parse(text) catch {
      case e: Exception => fail(s"its layout record cannot be read (${e.getMessage})")
    }
    json \ "format" match {
      case JInt(f) if f >= 1 && f <= Format =>
      case JInt(f) => fail(s"it was written by another version of UMJoin (state layout format $f" +
        s"; this version reads formats 1 to $Format)")
      case _ => fail("its layout record has no format")
    }
    val recorded = json \ "inputs" match {
      case JArray(items) => items
      case _ => fail("its layout record has no inputs")
    }
    if (recorded.size != inputs.size)
      fail(s"it was written for a join of ${recorded.size} inputs, this one has ${inputs.size}")
    def classOf(input: Int, key: String): Int =
      graph.classes.indices.find(c => graph.classes(c).keyOf(input).isDefined &&
        keyName(graph, input, c) == key)
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
      if (cols != columns(inputs(i))) fail(s"input #$i had columns (${cols.mkString(", ")}" +
        s"), now (${columns(inputs(i)).mkString(", ")})")
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
      val timeSlice = timeSlicing(item, partitions)
      (kind, partition, indexes, timeSlice)
    }.toIndexedSeq
    val routes = json \ "routes" match {
      case JArray(items) => items.map { item =>
        val start = item \ "start" match {
          case JInt(s) => s.toInt
          case _ => fail("a recorded route has no start")
        }
        val edges = item \ "edges" match {
          case JArray(es) =>
            es.collect { case JArray(List(JInt(f), JInt(t))) => (f.toInt, t.toInt) }
          case _ => Nil
        }
        start -> Route(start, edges)
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
    val stores = storesOf(json).fold(name =>
      fail(s"its layout record names an unknown way of keeping stores: $name"), identity)
    val layout = StreamingLayout(parsed.map(_._1), parsed.map(_._2), parsed.map(_._3), routes, cost,
      statistics, parsed.map(_._4), stores)
    layout.streams.find(s => !routes.get(s).exists(_.order.sorted == inputs.indices)).foreach { s =>
      fail(s"its recorded probe routes do not fit this join (none from input #$s through all " +
        s"${inputs.size} inputs)")
    }
    // A semi join's stream starts no route (its rows only let combinations through): its recorded
    // route is never probed.
    routes.values.filterNot(r => graph.filters.contains(r.start)).foreach { r =>
      scala.util.Try(layout.plan(graph, r)).failed.foreach(e =>
        fail(s"its recorded probe routes do not fit this join (route ${r.order.mkString(" -> ")}" +
          s": ${e.getMessage})"))
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

  /**
   * How the layout record names an outer join's non-preserved input (the others are inner, and not
   * named: older records read the same).
   */
  private val OuterJoinType = "left outer"

  private def columns(attributes: Seq[Attribute]): List[String] =
    attributes.map(a => s"${a.name} ${a.dataType.catalogString}").toList
}
