package umjoin.spark.streaming

import org.apache.spark.sql.execution.metric.SQLMetric
import org.apache.spark.sql.execution.streaming.operators.stateful.{StatefulOperatorCustomMetric,
  StatefulOperatorCustomSumMetric}

import umjoin.spark.core.probe.InputMetrics

/**
 * The StreamingUMJoin's own metrics, each declared once: its name (the SQL metric's, and in the
 * query's progress, `stateOperators[].customMetrics`) and what it counts. The operator declares
 * them ([[StreamingUMJoinExec.customStatefulOperatorMetrics]]) and its tasks add to them by these
 * names.
 */
private[streaming] object OperatorMetrics {

  /** A metric of the whole operator. */
  final case class Metric(name: String, counts: String) {
    def declared: StatefulOperatorCustomMetric = StatefulOperatorCustomSumMetric(name, counts)
  }

  /** A metric of each input, named after the input's number; described after its label. */
  final case class PerInput(name: Int => String, counts: String) {
    def declared(i: Int, label: String): StatefulOperatorCustomMetric =
      StatefulOperatorCustomSumMetric(name(i), s"input #$i $label: $counts")
  }

  val RouteChanges = Metric("probeRouteChanges", "probe routes changed before this batch")
  val CombinationsShipped =
    Metric("partialCombinationsShipped", "partial combinations shipped between stores")
  val StateRowsReadIntoMemory =
    Metric("stateRowsReadIntoMemory", "stored rows read into memory to be probed there")
  val MemoryIndexBytes =
    Metric("memoryIndexBytes", "bytes of the indexes built in memory to be probed")
  /** With time-sliced stores only. */
  val ShipNanos = Metric("partialCombinationsShipNanos",
    "time the shuffles took to write and read the partial combinations shipped (ns)")

  val StateRows = PerInput(i => s"stateRowsInput$i", "state rows")
  val StateIndexEntries = PerInput(i => s"stateIndexEntriesInput$i", "state index entries")
  val StateBytes = PerInput(i => s"stateBytesInput$i", "state memory bytes")
  val RowsIn = PerInput(InputMetrics.rowsIn, "rows in")
  val Probes = PerInput(InputMetrics.probes, "probes")
  val Matches = PerInput(InputMetrics.matches, "matches")
  val EarlyStops = PerInput(InputMetrics.earlyStops, "early stops")
  val ConditionChecks =
    PerInput(InputMetrics.conditionChecks, "rows tested by the conditions of the step into it")
  val CostlyChecks = PerInput(InputMetrics.costlyChecks,
    "rows tested by the conditions of the step into it that can fail (a UDF's calls)")

  /** Of an input spread by time slice. */
  val SlicePartitions =
    PerInput(i => s"slicePartitionsInput$i", "partitions holding its rows (time slices)")
  val EarlierSliceRows = PerInput(i => s"earlierSliceRowsInput$i",
    "rows placed by the time slices before a change a version before stretches recorded")
  val SliceCombinations =
    PerInput(i => s"sliceCombinationsInput$i", "partial combinations sent to its time slices")
  val SliceProbeNanos =
    PerInput(i => s"sliceProbeNanosInput$i", "time probing its time slices for them (ns)")

  /** Of an outer join's non-preserved input. */
  val NullPadded =
    PerInput(InputMetrics.nullPadded, "combinations put out with NULLs for its columns")

  /** Of a semi join's input. */
  val SemiDropped =
    PerInput(i => s"semiDroppedInput$i", "combinations dropped, no row matched them")
  val UnmatchedRows = PerInput(i => s"unmatchedRowsInput$i", "combinations waiting for a match")

  /** Of a stored static table. */
  val StaticLoads = PerInput(i => s"staticLoadsInput$i", "table loaded into its stores")
  val StaticCacheHits = PerInput(i => s"staticCacheHitsInput$i", "probes served by the cache")
  val StaticCacheMisses = PerInput(i => s"staticCacheMissesInput$i", "probes served by the stores")
  val StaticCachedKeys = PerInput(i => s"staticCachedKeysInput$i", "cached keys")
  val StaticCachedBytes = PerInput(i => s"staticCachedBytesInput$i", "cache memory bytes")
  val StaticDiskBytes = PerInput(i => s"staticDiskBytesInput$i", "store bytes on disk")
}

/** The metrics the tasks of a micro-batch add to (the node's SQL metrics, read on the driver). */
final case class StageMetrics(
    numOutputRows: SQLMetric,
    inputs: IndexedSeq[InputMetrics],
    shipped: SQLMetric,
    cachedStateRows: SQLMetric,
    memoryIndexBytes: SQLMetric,
    droppedLate: SQLMetric,
    updated: SQLMetric,
    removed: SQLMetric,
    updatesTimeMs: SQLMetric,
    removalsTimeMs: SQLMetric,
    commitTimeMs: SQLMetric,
    stateRows: IndexedSeq[SQLMetric],
    indexEntries: IndexedSeq[SQLMetric],
    slicePartitions: Map[Int, SQLMetric],
    sliceDrains: Map[Int, SliceDrain],
    sliceCosts: Option[SliceCostMetrics],
    slicedRows: Map[Int, SlicedRowsAccumulator],
    static: Map[Int, StaticMetrics],
    unmatched: Map[Int, UnmatchedMetrics])

/**
 * What the tasks measure of time-sliced stores' costs (see [[SliceCosts]]): per sliced input, the
 * combinations sent to its slices and the time testing them there; the time shipping combinations.
 */
final case class SliceCostMetrics(
    combinations: Map[Int, SQLMetric],
    probeNanos: Map[Int, SQLMetric],
    shipNanos: SQLMetric)

/**
 * The metrics of a semi join (by its input): combinations no row matched (dropped), and
 * combinations waiting for a match.
 */
final case class UnmatchedMetrics(gone: SQLMetric, waiting: SQLMetric)

/** The metrics of a stored static table. */
final case class StaticMetrics(
    hits: SQLMetric,
    misses: SQLMetric,
    cachedKeys: SQLMetric,
    cachedBytes: SQLMetric,
    diskBytes: SQLMetric)
