package umjoin.spark.testkit

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.Dataset
import org.apache.spark.sql.catalyst.expressions.AttributeSet
import org.apache.spark.sql.execution.FileSourceScanExec

import umjoin.spark.streaming.FirstBatchStatistics

/** The columns the job measuring a first micro-batch reads from the files of an input. */
object FirstBatchColumns {
  /** The file columns `input`'s plan reads when only `keys` (its output columns) are needed. */
  def read(input: Dataset[_], keys: java.util.List[String]): Array[String] = {
    val plan = input.queryExecution.executedPlan
    val needed = AttributeSet(plan.output.filter(a => keys.asScala.contains(a.name)))
    FirstBatchStatistics.readingOnly(plan, needed).collect {
      case scan: FileSourceScanExec => scan.requiredSchema.fieldNames.toSeq
    }.flatten.toArray
  }
}
