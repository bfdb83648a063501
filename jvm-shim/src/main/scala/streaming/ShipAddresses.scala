package umjoin.spark.streaming

import scala.collection.mutable

import org.apache.spark.sql.catalyst.expressions.{Attribute, Expression, UnsafeProjection}
import org.apache.spark.sql.catalyst.plans.physical.HashPartitioning

import umjoin.spark.core.probe.Route

/**
 * Where a stage before the last sends what it ships: a partial combination to the partition of the
 * store its next step probes by key, or to those of the time slices its time range overlaps; a
 * combination a semi join let through to the partition of the next semi join's store. Each
 * projection is made once per task.
 */
private[streaming] final class ShipAddresses(job: MicroBatchJob) {
  private val byKeys = mutable.Map[Shipped.Partial, UnsafeProjection]()
  private val bySlices =
    mutable.Map[Shipped.Partial, Option[(Int, SliceWindow, UnsafeProjection)]]()
  private val bySemis = mutable.Map[Int, UnsafeProjection]()

  /** The partition of a combination whose route's next step probes by key class `keyClass`. */
  def byKey(partial: Shipped.Partial, segment: Route.Segment, keyClass: Int): UnsafeProjection =
    byKeys.getOrElseUpdate(partial, {
      val bound = job.boundBy(partial, segment.until + 1)
      val value = bound.flatMap(x => job.graph.classes(keyClass).keyOf(x)).head
      partitionOf(value, bound.flatMap(job.outputs))
    })

  /**
   * Into a store spread by time slice: the input, its slicing as far as the combination binds its
   * bounds, and the combination's times those bounds read (None if the next store is not sliced).
   */
  def bySlice(partial: Shipped.Partial,
      segment: Route.Segment): Option[(Int, SliceWindow, UnsafeProjection)] =
    bySlices.getOrElseUpdate(partial, {
      val bound = job.boundBy(partial, segment.until + 1)
      val input = job.planOf(partial).steps(segment.until).input
      job.slices.get(input).map { window =>
        val known = window.copy(bounds = window.bounds.filter(b => bound.contains(b.input)))
        (input, known,
          UnsafeProjection.create(known.bounds.map(_.time), bound.flatMap(job.outputs)))
      }
    })

  /** The partition of a combination semi join `semi` waits in. */
  def ofSemi(semi: UnmatchedSpec): UnsafeProjection =
    bySemis.getOrElseUpdate(semi.nonPreserved,
      partitionOf(semi.spec.partitionKey, semi.spec.output))

  /**
   * The partition of a row of `attributes` whose store is partitioned by `key` (the one Spark's
   * shuffle of that key gives it).
   */
  private def partitionOf(key: Expression, attributes: Seq[Attribute]): UnsafeProjection =
    UnsafeProjection.create(
      Seq(HashPartitioning(Seq(key), job.info.numPartitions).partitionIdExpression), attributes)
}
