package umjoin.spark.streaming

import java.util.UUID

import scala.util.Try

import org.apache.hadoop.fs.Path
import org.json4s.JsonAST.{JArray, JObject, JString}
import org.json4s.jackson.JsonMethods.parse

import org.apache.spark.TaskContext
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Alias, BoundReference, Literal, UnsafeProjection}
import org.apache.spark.sql.catalyst.parser.CatalystSqlParser
import org.apache.spark.sql.catalyst.plans.logical.{LocalRelation, Project}
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.classic.{SparkSession => ClassicSession}
import org.apache.spark.sql.connector.catalog.{SupportsRead, Table, TableCapability, TableProvider}
import org.apache.spark.sql.connector.expressions.Transform
import org.apache.spark.sql.connector.read.{Batch, InputPartition, PartitionReader,
  PartitionReaderFactory, Scan, ScanBuilder}
import org.apache.spark.sql.execution.streaming.checkpointing.{CommitLog, OffsetSeqLog,
  OffsetSeqMetadata}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.state.{OperatorStateMetadataV1,
  OperatorStateMetadataV1Reader}
import org.apache.spark.sql.sources.DataSourceRegister
import org.apache.spark.sql.types.{DataType, IntegerType, StructField, StructType}
import org.apache.spark.sql.util.CaseInsensitiveStringMap
import org.apache.spark.util.SerializableConfiguration

/**
 * The rows a StreamingUMJoin holds for one of its stream inputs, read from a query's checkpoint:
 * `spark.read.format("umjoin-state").option("input", "x").load(checkpointLocation)`. Spark's own
 * state reader (format "statestore") refuses, in Spark 4.3, a store name other than its joins'
 * and transformWithState's, so the inputs' stores are read here, through the same state store API,
 * with the schemas of the checkpoint's layout record. Options: `input` (its label or position, as
 * `explain()` shows them), `operatorId` (by default the checkpoint's only StreamingUMJoin) and
 * `batchId` (by default the last committed). Columns: the input's, then `partition_id`.
 */
final class StoredInputSource extends TableProvider with DataSourceRegister {
  override def shortName(): String = StoredInputSource.ShortName

  override def inferSchema(options: CaseInsensitiveStringMap): StructType =
    StoredInput.of(SparkSession.active, options).schema

  override def getTable(schema: StructType, partitioning: Array[Transform],
      properties: java.util.Map[String, String]): Table =
    StoredInputTable(StoredInput.of(SparkSession.active, new CaseInsensitiveStringMap(properties)))
}

object StoredInputSource {
  val ShortName = "umjoin-state"
}

/** One stream input's stores at one committed micro-batch: what every partition's reader needs. */
final case class StoredInput(stateRoot: String, operatorId: Long, input: Int, label: String,
    columns: StructType, partitionKeyType: DataType, partitions: Int, version: Long,
    stores: StoreLayout, storeConfs: InputStateConf, hadoopConf: SerializableConfiguration) {
  def schema: StructType = columns.add(StructField("partition_id", IntegerType, nullable = false))
  /** The input's rows' store, as the checkpoint's layout keeps it. */
  def rowStore: StoreSchema = InputStateSpec.rowStore(InputState.storeName(input),
    partitionKeyType, columns, stores.rowsListedByKey)
}

object StoredInput {
  private def fail(message: String): Nothing =
    throw new IllegalArgumentException(s"${StoredInputSource.ShortName}: $message")

  /** What the options name, checked against the checkpoint, each problem named with its fix. */
  def of(session: SparkSession, options: CaseInsensitiveStringMap): StoredInput = {
    val classic = session match {
      case c: ClassicSession => c
      case _ => fail("reads a checkpoint on the driver; run it on a classic session")
    }
    val checkpoint = Option(options.get("path")).getOrElse(fail(
      "name the query's checkpoint location: .load(\"<checkpointLocation>\")"))
    val hadoopConf = classic.sessionState.newHadoopConf()
    val stateRoot = new Path(checkpoint, "state").toString
    val batchId = Option(options.get("batchId")).map(b => Try(b.toLong).toOption
      .filter(_ >= 0).getOrElse(fail(s"batchId must be a micro-batch number, not $b")))
      .getOrElse(new CommitLog(classic, new Path(checkpoint, "commits").toString).getLatest()
        .map(_._1).getOrElse(fail(s"$checkpoint has no committed micro-batch")))
    val umjoins = OperatorCheckpoint.operatorsIn(stateRoot, hadoopConf)
      .filter(_._2 == StreamingUMJoinExec.ShortName).keys.toSeq.sorted
    val operatorId = Option(options.get("operatorId")) match {
      case Some(id) => Try(id.toLong).toOption.filter(umjoins.contains).getOrElse(fail(
        s"operator $id of $checkpoint is not a StreamingUMJoin; its StreamingUMJoins: " +
          umjoins.mkString(", ")))
      case None if umjoins.size == 1 => umjoins.head
      case None if umjoins.isEmpty => fail(s"$checkpoint holds no StreamingUMJoin state")
      case None => fail(s"$checkpoint holds several StreamingUMJoins (operators " +
        s"${umjoins.mkString(", ")}): name one with option operatorId")
    }
    val operatorDir = new Path(stateRoot, operatorId.toString)
    val layoutFile = new Path(operatorDir, "_umjoin_layout.json")
    val fs = layoutFile.getFileSystem(hadoopConf)
    if (!fs.exists(layoutFile)) {
      fail(s"operator $operatorId of $checkpoint has no layout record ($layoutFile): its " +
        "state was written by a UMJoin version this one cannot read")
    }
    val record = parse(OperatorCheckpoint.textOf(fs, layoutFile))
    val stores = OperatorCheckpoint.storesOf(record).fold(name => fail(
      s"$layoutFile keeps its stores in a way this UMJoin version cannot read: $name"), identity)
    val inputs = record \ "inputs" match {
      case JArray(items) => items
      case _ => fail(s"$layoutFile lists no inputs")
    }
    def labelOf(item: org.json4s.JValue): String = (item \ "label") match {
      case JString(l) => l
      case _ => "?"
    }
    val labels = inputs.map(labelOf)
    val named = Option(options.get("input")).getOrElse(fail(
      s"name the input to read with option input: one of ${labels.mkString(", ")} (or 0-" +
        s"${labels.size - 1})"))
    val input = labels.indexOf(named) match {
      case -1 => Try(named.toInt).toOption.filter(labels.indices.contains).getOrElse(fail(
        s"operator $operatorId has no input $named; its inputs: ${labels.mkString(", ")}"))
      case i => i
    }
    val entry = inputs(input).asInstanceOf[JObject]
    if ((entry \ "kind") != JString(InputKind.Stream.name)) {
      fail(s"input ${labels(input)} is a ${(entry \ "kind").values} table, not a stream: " +
        "a stream input's rows are what the state holds")
    }
    if ((entry \ "timeSliceMs") != org.json4s.JNothing) {
      fail(s"input ${labels(input)} is cut into time slices, which this reader does not read")
    }
    val columns = StructType((entry \ "columns").children.map {
      case JString(column) => field(column).getOrElse(fail(s"$layoutFile: column $column"))
      case other => fail(s"$layoutFile: column $other")
    })
    val partitionKey = (entry \ "partitionedBy") match {
      case JString(key) => key.split(" ON ").head
      case _ => fail(s"input ${labels(input)} is not partitioned by a key")
    }
    val partitions = new OperatorStateMetadataV1Reader(operatorDir, hadoopConf).read()
      .collect { case m: OperatorStateMetadataV1 => m.stateStoreInfo.head.numPartitions }
      .getOrElse(fail(s"operator $operatorId of $checkpoint has no operator metadata"))
    val conf = classic.sessionState.conf.clone()
    new OffsetSeqLog(classic, new Path(checkpoint, "offsets").toString).get(batchId)
      .flatMap(_.metadataOpt)
      .foreach(OffsetSeqMetadata.setSessionConf(_, conf))
    StoredInput(stateRoot, operatorId, input, labels(input), columns,
      typeOf(classic, partitionKey, columns), partitions,
      batchId + 1, stores, InputStateConf(conf), new SerializableConfiguration(hadoopConf))
  }

  /** "name type" as the layout record writes a column (a name may hold spaces, a type too). */
  private def field(column: String): Option[StructField] =
    column.indices.filter(column(_) == ' ').iterator.flatMap { at =>
      Try(CatalystSqlParser.parseDataType(column.substring(at + 1))).toOption
        .map(StructField(column.substring(0, at), _))
    }.nextOption()

  /** The type of the input's partitioning key, an expression over its columns. */
  private def typeOf(session: ClassicSession, key: String, columns: StructType): DataType = {
    val relation = LocalRelation(DataTypeUtils.toAttributes(columns))
    val plan = Project(Seq(Alias(session.sessionState.sqlParser.parseExpression(key), "key")()),
      relation)
    Try(session.sessionState.executePlan(plan).analyzed.schema.head.dataType).getOrElse(
      fail(s"the partitioning key $key cannot be read over the input's columns"))
  }
}

private final case class StoredInputTable(stored: StoredInput) extends Table with SupportsRead {
  override def name(): String = s"${StoredInputSource.ShortName} ${stored.label}"
  override def schema(): StructType = stored.schema
  override def capabilities(): java.util.Set[TableCapability] =
    java.util.EnumSet.of(TableCapability.BATCH_READ)
  override def newScanBuilder(options: CaseInsensitiveStringMap): ScanBuilder = () =>
    new Scan with Batch {
      override def readSchema(): StructType = stored.schema
      override def toBatch: Batch = this
      override def planInputPartitions(): Array[InputPartition] =
        Array.tabulate[InputPartition](stored.partitions)(StoredPartition)
      override def createReaderFactory(): PartitionReaderFactory = StoredReaderFactory(stored)
    }
}

private final case class StoredPartition(partition: Int) extends InputPartition

private final case class StoredReaderFactory(stored: StoredInput) extends PartitionReaderFactory {
  override def createReader(partition: InputPartition): PartitionReader[InternalRow] =
    new StoredRowsReader(stored, partition.asInstanceOf[StoredPartition].partition)
}

/** One partition's rows of the input's store, each followed by its partition's number. */
private final class StoredRowsReader(stored: StoredInput, partition: Int)
  extends PartitionReader[InternalRow] {
  // (Released when the reading task ends.)
  private val rows = StoredRows(new PartitionStores(stored.stores,
    StatefulOperatorStateInfo(stored.stateRoot, UUID.randomUUID(), stored.operatorId,
      stored.version, stored.partitions), partition, stored.storeConfs,
    stored.hadoopConf.value, TaskContext.get())
    .read(stored.rowStore, stored.storeConfs.rows), stored.rowStore, stored.partitionKeyType,
    stored.columns.size).all()
  private val withPartition = UnsafeProjection.create(stored.columns.fields.zipWithIndex.map {
    case (f, i) => BoundReference(i, f.dataType, f.nullable)
  }.toSeq :+ Literal(partition))
  private var current: InternalRow = _

  override def next(): Boolean = rows.hasNext && {
    current = withPartition(rows.next().row)
    true
  }
  override def get(): InternalRow = current
  override def close(): Unit = ()
}
