package umjoin.spark.streaming

import umjoin.spark.core.GraphShape
import umjoin.spark.core.cost.{ProbeOrderSettings, StaticCacheSettings}

/**
 * A StreamingUMJoin as its planner describes it, less its expressions (fields of the operator of
 * their own, where Catalyst sees them): the one description the operator holds and every task of
 * its micro-batches reads.
 *
 * @param inputLabels what each input reads, for plans and metric names people read
 * @param graphShape  the join graph without its expressions (see [[umjoin.spark.core.JoinGraph]])
 * @param layout      the state layout: the checkpoint's, or chosen by the operator from its
 *                    first micro-batch
 * @param paddingStarts per outer input, the stream whose event time its join's state watermark
 *                    reads (see [[OuterPadding]])
 * @param sliceBounds per input spread by time slice, how far its event time can be from each other
 *                    stream's in a result (see [[SliceWindow]]): a combination is sent only to the
 *                    slices that range overlaps
 * @param outputWatermarkShiftMs the group's output watermark less its input watermark in Spark's
 *                    join tree (see [[JoinWatermarks]])
 * @param evictionWatermark the event-time watermark the group's joins evict by, as Spark gives it
 * @param inputWatermark the input watermark Spark's simulation gives this operator, where the
 *                    streaming planner knows it (the joins' own watermarks are below it)
 * @param probeOrder  how routes are chosen (spark.umjoin.probeOrder; fixed where an outer or semi
 *                    join's stream is probed last in every route)
 * @param stateTtlMs  optional bound on how long any stored row is kept (spark.umjoin.stateTtl):
 *                    rows stored longer ago are not probed any more, and removed
 * @param stateCacheRows a stream's stored rows are read into memory and probed there where a task's
 *                    partition holds at most this many (spark.umjoin.stateCacheRows)
 * @param staticCache what executors keep in memory of stored static tables
 *                    (spark.umjoin.staticCache)
 * @param takeOver    the state of Spark's joins this micro-batch takes over, where the query ran
 *                    them before (see [[SparkJoinTakeOver]])
 */
final case class GroupSpec(
    inputLabels: Seq[String],
    graphShape: GraphShape,
    layout: GroupLayout,
    paddingStarts: Map[Int, Int],
    sliceBounds: Seq[Seq[SliceWindow.Bound]],
    outputWatermarkShiftMs: Long,
    evictionWatermark: Option[Long],
    inputWatermark: Option[Long],
    probeOrder: ProbeOrderSettings,
    stateTtlMs: Option[Long],
    stateCacheRows: Long,
    staticCache: StaticCacheSettings,
    takeOver: Option[SparkJoinTakeOver] = None) {

  /** The non-preserved streams of the group's semi joins, lowest join first (the inputs' order). */
  def semiInputs: Seq[Int] = graphShape.filters.keys.toSeq.sorted

  /**
   * Every store of a partition: with `layout` unknown (a new checkpoint's, before its first
   * micro-batch chose it), the ones every layout keeps.
   */
  def storeNames(chosen: Option[StreamingLayout]): Seq[String] = {
    val stored = StreamingLayout.storedOf(layout.kinds)
    (if (layout.stores.oneStorePerPartition) {
      if (stored.isEmpty) Nil else Seq(InputState.PartitionStoreName)
    } else stored.flatMap { j =>
      InputState.storeName(j) +: chosen.fold(Seq.empty[String])(c =>
        c.indexes(j).indices.map(InputState.indexStoreName(InputState.storeName(j), _)))
    }) ++ semiInputs.map(InputState.unmatchedStoreName)
  }
}
