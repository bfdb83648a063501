package umjoin.spark.streaming

import org.apache.spark.sql.execution.metric.SQLMetric

/**
 * What a micro-batch measured of the work its time-sliced stores cost (PSP's T_j, T_s and
 * the rows a window holds, paper 004), read by the next batch's planning to choose the slice counts
 * with `spark.umjoin.timeSlices=auto` ([[SliceCount]]). The figures are the batch's metrics, summed
 * over its tasks: those its tasks time (`timed`), the stored rows of each sliced input the
 * conditions tested (`tested`) and the partial combinations shipped between stages (`shipped`: one
 * per partition sent to). `slices`: each sliced input's count in the batch. `rows`: the event times
 * of each sliced input's rows stored after the batch and brought by it (a new slicing is cut past
 * the former, its width balanced by both's rates).
 */
final case class SliceCosts(storeVersion: Long,
    slices: Map[Int, Int], partitions: Int, timed: SliceCostMetrics,
    tested: Map[Int, SQLMetric], shipped: SQLMetric, rows: Map[Int, SlicedRowsAccumulator]) {

  /**
   * What the batch before the one of `version` reported of sliced input j's rows, where every
   * partition reported.
   */
  def rowsBefore(version: Long, j: Int): Option[SlicedRows] =
    rows.get(j).map(_.value).filter(reported => storeVersion == version - 1 &&
      reported.partitions.size == partitions)

  /**
   * What the batch before the one of `version` measured for sliced input j, where it tested and
   * shipped rows.
   */
  def measuredBefore(version: Long, j: Int): Option[SliceCount.Measured] =
    for {
      n <- slices.get(j) if storeVersion == version - 1 && shipped.value > 0
      combinations <- timed.combinations.get(j).map(_.value) if combinations > 0
      tested <- tested.get(j).map(_.value) if tested > 0
    } yield {
      // A combination tests the rows of the slices its range overlaps (n + 1 of a span cut in n;
      // every partition's at most).
      val overlapped = math.min(n, partitions - 1)
      SliceCount.Measured(
        testNanos = timed.probeNanos(j).value.toDouble / tested,
        rowsPerSpan = tested.toDouble / combinations * overlapped / (overlapped + 1),
        sendNanos = timed.shipNanos.value.toDouble / shipped.value)
    }
}

/**
 * The number of time slices a stream's window is cut into, by PSP's cost model (paper 004, section
 * 5) mapped onto Spark's stages: a combination sent to a sliced store goes to the partitions of the
 * n + 1 slices its range overlaps (at most all `partitions`) and tests the rows of those slices,
 * (n + 1) / n of a span's rows; the partitions it goes to work in parallel, as many at once as
 * there are cores. So a combination costs (T_j·R·(n + 1)/n + T_s·(n + 1)) / min(n + 1, cores):
 * more slices spread the tests over more cores and test fewer rows past the window, but send each
 * combination to more partitions. Up to the cores the first wins; past them the optimum is n =
 * sqrt(T_j·R / T_s).
 */
object SliceCount {

  /**
   * A sliced store's costs as measured: ns per stored row tested (T_j), the rows a span of its
   * event times holds (R), ns to ship a combination to one partition (T_s).
   */
  final case class Measured(testNanos: Double, rowsPerSpan: Double, sendNanos: Double)

  /**
   * A new count must be predicted this much faster than the current one: measurements vary from
   * batch to batch.
   */
  val Hysteresis = 0.8

  /** The predicted time per combination sent to a store of `n` slices per span (ns). */
  def predictedNanos(m: Measured, n: Int, cores: Int, partitions: Int): Double = {
    val overlapped = math.min(n, partitions - 1).max(1)
    val sends = math.min(n + 1, partitions)
    (m.testNanos * m.rowsPerSpan * (overlapped + 1) / overlapped + m.sendNanos * sends) /
      math.min(sends, cores).max(1)
  }

  /**
   * The count of least predicted time from 1 to `partitions`, where it beats the `current` one by
   * the hysteresis.
   */
  def best(m: Measured, current: Int, cores: Int, partitions: Int): Int = {
    val fastest = (1 to partitions).minBy(predictedNanos(m, _, cores, partitions))
    if (predictedNanos(m, fastest, cores, partitions) < Hysteresis * predictedNanos(m, current,
      cores, partitions)) fastest else current
  }
}
