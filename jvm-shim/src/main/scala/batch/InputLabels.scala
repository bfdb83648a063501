package umjoin.spark.batch

import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.execution.adaptive.LogicalQueryStage
import org.apache.spark.sql.execution.datasources.{HadoopFsRelation, LogicalRelation}

/** Names for a UMJoin's inputs in plans: the tables (or files) each input reads, left to right. */
object InputLabels {

  def of(plan: LogicalPlan): String = leafNames(plan).distinct.mkString("+")

  private def leafNames(plan: LogicalPlan): Seq[String] = plan match {
    case stage: LogicalQueryStage => leafNames(stage.logicalPlan)
    case r: LogicalRelation =>
      Seq(r.catalogTable.map(_.identifier.table).getOrElse(r.relation match {
        case fs: HadoopFsRelation =>
          fs.location.rootPaths.headOption.map(p => baseName(p.getName)).getOrElse("files")
        case other => other.getClass.getSimpleName
      }))
    case leaf if leaf.children.isEmpty => Seq(leaf.nodeName)
    case other => other.children.flatMap(leafNames)
  }

  /** `lineitem.parquet` and `lineitem` both read as `lineitem`. */
  private def baseName(file: String): String = file.indexOf('.') match {
    case i if i > 0 => file.substring(0, i)
    case _ => file
  }
}
