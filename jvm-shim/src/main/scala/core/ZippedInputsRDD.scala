package umjoin.spark.core

import scala.reflect.ClassTag

import org.apache.spark.{OneToOneDependency, Partition, TaskContext}
import org.apache.spark.rdd.RDD

private final class ZippedInputsPartition(override val index: Int, val inputs: Seq[Partition])
  extends Partition

/**
 * Partition i of every input, handed to `f` together: the co-partitioned inputs of a UMJoin.
 * `f` reads input j's partition by calling its argument with j, when it needs it (a streaming
 * stage may need an input only for some steps) and anew at every call.
 * (Spark's RDD.zipPartitions stops at four inputs; a UMJoin may have more.) `preferred` gives a
 * partition's preferred executors where they do not follow from the inputs (a stateful task: where
 * its state stores are loaded); without it, or where it knows none, the inputs' preferences count.
 */
final class ZippedInputsRDD[T: ClassTag, U: ClassTag](
    @transient private var inputs: Seq[RDD[T]],
    f: (TaskContext, Int => Iterator[T]) => Iterator[U],
    @transient private val preferred: Option[Int => Seq[String]] = None)
  extends RDD[U](inputs.head.sparkContext, inputs.map(new OneToOneDependency(_))) {

  override protected def getPartitions: Array[Partition] = {
    val counts = inputs.map(_.getNumPartitions).distinct
    require(counts.size == 1,
      s"UMJoin inputs must be co-partitioned, got partition counts ${counts.mkString(", ")}")
    Array.tabulate(counts.head)(i => new ZippedInputsPartition(i, inputs.map(_.partitions(i))))
  }

  override def compute(split: Partition, context: TaskContext): Iterator[U] = {
    val partition = split.asInstanceOf[ZippedInputsPartition]
    val sources = dependencies.zip(partition.inputs)
    f(context, j => sources(j)._1.rdd.asInstanceOf[RDD[T]].iterator(sources(j)._2, context))
  }

  override def getPreferredLocations(split: Partition): Seq[String] =
    preferred.map(_(split.index)).filter(_.nonEmpty).getOrElse {
      val partition = split.asInstanceOf[ZippedInputsPartition]
      dependencies.zip(partition.inputs)
        .flatMap { case (dep, p) => dep.rdd.preferredLocations(p) }.distinct
    }

  override def clearDependencies(): Unit = {
    super.clearDependencies()
    inputs = null
  }
}
