package umjoin.spark.streaming

import scala.util.control.NonFatal

import org.apache.spark.internal.Logging
import org.apache.spark.sql.catalyst.expressions.{AttributeSet, BindReferences, Expression,
  GenericInternalRow}
import org.apache.spark.sql.catalyst.util.HyperLogLogPlusPlusHelper
import org.apache.spark.sql.execution.{ColumnarToRowExec, FileSourceScanExec, FilterExec,
  InputAdapter, ProjectExec, SparkPlan, WholeStageCodegenExec}
import org.apache.spark.sql.execution.streaming.operators.stateful.{EventTimeWatermarkExec,
  StatefulOperator}
import org.apache.spark.sql.types.StructType

import umjoin.spark.core.JoinGraph
import umjoin.spark.core.cost.JoinSizes

/**
 * An input's rows in the micro-batch measured, and the distinct values of each of its join keys.
 */
final case class MeasuredInput(rows: Long, distinct: Seq[Long])

/**
 * The probe-cost model's statistics, measured by a StreamingUMJoin when it runs the first
 * micro-batch of a new checkpoint: each of its inputs runs once more, counting its rows and, with
 * HyperLogLog++ (2 % error), the distinct values of each of its join keys. Spark's plan estimates
 * know file sizes only, not how many rows a filter keeps (TPC-H Q9's parts named '%green%': 5 %),
 * nor how many values a key takes; and the layout chosen from these figures (partitioning keys,
 * indexes, routes) stays with the checkpoint for the life of the query. It costs reading the first
 * micro-batch's inputs twice (the second time only the columns keys and filters read), in one job,
 * once per checkpoint.
 */
object FirstBatchStatistics extends Logging {

  private val RelativeError = 0.02

  /**
   * Each input's figures, from one job over all of them (a job per input cost about 0.6 s each,
   * most of a new query's first planning on eight inputs). None for an input where running it
   * again would not be a pure read: an input that keeps state of its own (a deduplication, an
   * aggregation) would write it twice; and None for every input if the job fails (Spark's plan
   * estimates serve). A watermark node only observes the rows going through it, so it is left out
   * of the second run.
   */
  def measure(inputs: Seq[(SparkPlan, Seq[Expression])]): Seq[Option[MeasuredInput]] = {
    val pure = inputs.indices.filterNot(i => inputs(i)._1.exists(_.isInstanceOf[StatefulOperator]))
    val figures =
      if (pure.isEmpty) Map.empty[Int, MeasuredInput]
      else try pure.zip(measured(pure.map(inputs))).toMap catch {
        case NonFatal(e) =>
          val names = pure.map(inputs(_)._1.nodeName).mkString(", ")
          logWarning(s"UMJoin: the first micro-batch of $names could not be measured " +
            s"(${e.getMessage}); Spark's plan estimates serve")
          Map.empty[Int, MeasuredInput]
      }
    inputs.indices.map(figures.get)
  }

  private def measured(inputs: Seq[(SparkPlan, Seq[Expression])]): Seq[MeasuredInput] = {
    val sketch = new HyperLogLogPlusPlusHelper(RelativeError)
    def sketches(count: Int) =
      Seq.fill(count)(new GenericInternalRow(Array.fill[Any](sketch.numWords)(0L)))
    // Run by the operator inside the micro-batch's SQL execution: its tasks read the session's
    // SQL settings (code generation's among them) as the query's own tasks do.
    val perPartition: Array[(Int, Long, Seq[GenericInternalRow])] = {
      val perInput = inputs.zipWithIndex.map { case ((input, keys), i) =>
        // A copy, so that the plan's own SQL metrics (a batch's input rows among them) count the
        // batch once.
        val unwatched = input.clone().transformUp { case w: EventTimeWatermarkExec => w.child }
        val copy = readingOnly(unwatched, AttributeSet(keys.flatMap(_.references)))
        val bound = keys.map(BindReferences.bindReference(_, copy.output))
        copy.execute().mapPartitions { rows =>
          val buffers = sketches(bound.size)
          var count = 0L
          rows.foreach { row =>
            count += 1
            bound.zip(buffers).foreach { case (key, buffer) =>
              val value = key.eval(row)
              if (value != null) sketch.update(buffer, 0, value, key.dataType)
            }
          }
          Iterator.single((i, count, buffers))
        }
      }
      perInput.head.sparkContext.union(perInput).collect()
    }
    inputs.indices.map { i =>
      val parts = perPartition.filter(_._1 == i)
      val merged = sketches(inputs(i)._2.size)
      parts.foreach { case (_, _, buffers) =>
        merged.zip(buffers).foreach { case (into, from) => sketch.merge(into, from, 0, 0) }
      }
      MeasuredInput(parts.map(_._2).sum, merged.map(sketch.query(_, 0)))
    }
  }

  /**
   * `plan` with its file scans reading only the columns `needed` above them and what the filters
   * between read (the statistics need the keys, not the rows: TPC-H's lineitem has 16 columns),
   * through filters, projections and the wrappers of code generation; below any other node the plan
   * stays as it is.
   */
  private[umjoin] def readingOnly(plan: SparkPlan, needed: AttributeSet): SparkPlan = plan match {
    case scan: FileSourceScanExec =>
      val output = scan.output.filter(needed.contains)
      val names = output.map(_.name).toSet
      scan.copy(output = output,
        requiredSchema = StructType(scan.requiredSchema.filter(f => names.contains(f.name))))
    case filter: FilterExec =>
      filter.withNewChildren(Seq(readingOnly(filter.child, needed ++ filter.condition.references)))
    case project: ProjectExec =>
      val kept = project.projectList.filter(e => needed.contains(e.toAttribute))
      ProjectExec(kept, readingOnly(project.child, AttributeSet(kept.flatMap(_.references))))
    case _: WholeStageCodegenExec | _: InputAdapter | _: ColumnarToRowExec =>
      plan.withNewChildren(Seq(readingOnly(plan.children.head, needed)))
    case other => other
  }

  /**
   * Join sizes from every input's figures: its rows, and per key class the most distinct values any
   * of its inputs shows (the domain of the key side, which the foreign keys' values are drawn
   * from). None when an input could not be measured or no input had rows.
   */
  def sizes(measured: Seq[Option[MeasuredInput]], graph: JoinGraph): Option[JoinSizes] =
    if (measured.exists(_.isEmpty) || measured.flatten.forall(_.rows == 0)) None
    else {
      val figures = measured.flatten.toIndexedSeq
      val distinct = graph.classes.indices.map { c =>
        val values = figures.indices.flatMap(i => keyClasses(graph, i).indexOf(c) match {
          case -1 => None
          case k => Some(figures(i).distinct(k))
        })
        math.max(1.0, values.max.toDouble)
      }
      Some(JoinSizes(figures.map(f => math.max(1.0, f.rows.toDouble)), distinct))
    }

  /** The key classes input `i` joins on, in class order: the keys [[measure]] counts for it. */
  def keyClasses(graph: JoinGraph, i: Int): Seq[Int] =
    graph.classes.indices.filter(c => graph.classes(c).keyOf(i).isDefined)

  /** Input `i`'s key expressions, in the order of [[keyClasses]]. */
  def keys(graph: JoinGraph, i: Int): Seq[Expression] =
    keyClasses(graph, i).map(c => graph.classes(c).keyOf(i).get)
}
