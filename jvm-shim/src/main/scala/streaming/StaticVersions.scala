package umjoin.spark.streaming

import scala.util.Try

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path

import org.apache.spark.sql.catalyst.plans.logical.{LocalRelation, LogicalPlan}
import org.apache.spark.sql.execution.{FileSourceScanExec, LocalTableScanExec, PlanLater, SparkPlan}
import org.apache.spark.sql.execution.datasources.{HadoopFsRelation, LogicalRelation}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo

/**
 * When the stores of a stored static table (SSBJ's master data, paper 003) are written: in the
 * first micro-batch of a query run, and again in a batch that finds the table changed. A table
 * counts as unchanged while its plan is the same (canonically) and every file it reads has the same
 * length and modification time, checked on the driver before each batch. Only plans whose leaves
 * are file scans or local tables, with no nondeterministic expression and no subquery, can be
 * checked ([[versionable]]); any other static table is read in every batch, as Spark reads it.
 *
 * Each load gets a number no other load of this driver has (`generation`): what an executor keeps
 * in memory of a stored table ([[StaticCaches]]) is valid for one load only. The last loads are
 * kept in the query run's [[StreamingRun]].
 */
object StaticVersions {
  private val generations = new java.util.concurrent.atomic.AtomicLong()

  /** What a static table's rows depend on. */
  final case class Fingerprint private[StaticVersions] (plan: SparkPlan,
      files: Seq[(String, Long, Long)])
  /**
   * A table's last load: what it was loaded from, in which version of its stores, and the load's
   * number.
   */
  final case class Loaded private[StaticVersions] (fingerprint: Fingerprint, storeVersion: Long,
      generation: Long)

  /**
   * What a micro-batch does with a stored static table: write it now (`load`), or probe what load
   * `generation` wrote.
   */
  final case class Decision(load: Boolean, generation: Long)

  /**
   * Whether the rows of `plan` can be known unchanged between micro-batches (see above); a part
   * still to be planned by what it will be planned as.
   */
  def versionable(plan: SparkPlan): Boolean =
    !plan.exists(p => p.subqueries.nonEmpty || p.expressions.exists(!_.deterministic)) &&
      plan.collectLeaves().forall {
        case later: PlanLater => versionable(later.plan)
        case leaf => leaf.isInstanceOf[FileSourceScanExec] || leaf.isInstanceOf[LocalTableScanExec]
      }

  /** [[versionable]] for a logical plan: its leaves are file relations or local tables. */
  def versionable(plan: LogicalPlan): Boolean =
    !plan.isStreaming &&
      !plan.exists(p => p.subqueries.nonEmpty || p.expressions.exists(!_.deterministic)) &&
      plan.collectLeaves().forall {
        case r: LogicalRelation => r.relation.isInstanceOf[HadoopFsRelation]
        case leaf => leaf.isInstanceOf[LocalRelation]
      }

  /**
   * This micro-batch's decision for static input `input` (plan `child`). A batch executed again (a
   * foreachBatch sink running its data frame twice) decides as it did the first time, unless the
   * table changed in between.
   */
  def decide(run: StreamingRun, info: StatefulOperatorStateInfo, input: Int, child: SparkPlan,
      hadoopConf: Configuration): Decision = {
    val loaded = run.staticLoads
    val key = (info.operatorId, input)
    val now = fingerprint(child, hadoopConf)
    val previous = Option(loaded.get(key))
    previous match {
      case Some(before) if now.contains(before.fingerprint) &&
          info.storeVersion > before.storeVersion =>
        Decision(load = false, before.generation)
      case _ =>
        val generation = generations.incrementAndGet()
        // A table that cannot be fingerprinted (a file vanished) is loaded in every batch, and
        // never counted unchanged.
        now match {
          case Some(f) => loaded.put(key, Loaded(f, info.storeVersion, generation))
          case None => loaded.remove(key)
        }
        Decision(load = true, generation)
    }
  }

  private def fingerprint(child: SparkPlan, hadoopConf: Configuration): Option[Fingerprint] =
    if (!versionable(child)) None
    else {
      val files = child.collectLeaves().flatMap {
        case scan: FileSourceScanExec => scan.relation.location.inputFiles.toSeq
        case _ => Nil
      }
      Try(files.sorted.map { file =>
        val path = new Path(file)
        val status = path.getFileSystem(hadoopConf).getFileStatus(path)
        (file, status.getLen, status.getModificationTime)
      }).toOption.map(Fingerprint(child.canonicalized, _))
    }
}
