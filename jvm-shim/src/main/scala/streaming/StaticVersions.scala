package umjoin.spark.streaming

import java.util.UUID
import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.atomic.AtomicLong

import scala.util.Try

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path

import org.apache.spark.SparkContext
import org.apache.spark.scheduler.{SparkListener, SparkListenerEvent}
import org.apache.spark.sql.execution.{FileSourceScanExec, LocalTableScanExec, SparkPlan}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.streaming.StreamingQueryListener

/**
 * When the stores of a stored static table (paper 003's master data) are written: in the first
 * micro-batch of a query run, and again in a batch that finds the table changed. A table counts as
 * unchanged while its plan is the same (canonically) and every file it reads has the same length
 * and modification time, checked on the driver before each batch. Only plans whose leaves are file
 * scans or local tables, with no nondeterministic expression and no subquery, can be checked
 * ([[versionable]]); any other static table is read in every batch, as Spark reads it.
 *
 * Each load gets a number no other load of this driver has (`generation`): what an executor keeps
 * in memory of a stored table ([[StaticCaches]]) is valid for one load only.
 */
object StaticVersions {

  /** What a static table's rows depend on. */
  private final case class Fingerprint(plan: SparkPlan, files: Seq[(String, Long, Long)])
  private final case class Key(runId: UUID, operatorId: Long, input: Int)
  private final case class Loaded(fingerprint: Fingerprint, storeVersion: Long, generation: Long)

  /** What a micro-batch does with a stored static table: write it now (`load`), or probe what load `generation` wrote. */
  final case class Decision(load: Boolean, generation: Long)

  private val loaded = new ConcurrentHashMap[Key, Loaded]()
  private val generations = new AtomicLong()
  private var listeningTo: Option[SparkContext] = None

  /** Whether the rows of `plan` can be known unchanged between micro-batches (see above). */
  def versionable(plan: SparkPlan): Boolean =
    !plan.exists(p => p.subqueries.nonEmpty || p.expressions.exists(!_.deterministic)) &&
      plan.collectLeaves().forall(leaf => leaf.isInstanceOf[FileSourceScanExec] || leaf.isInstanceOf[LocalTableScanExec])

  /**
   * This micro-batch's decision for static input `input` (plan `child`). A batch executed again (a
   * foreachBatch sink running its data frame twice) decides as it did the first time, unless the
   * table changed in between.
   */
  def decide(info: StatefulOperatorStateInfo, input: Int, child: SparkPlan, hadoopConf: Configuration): Decision = {
    val key = Key(info.queryRunId, info.operatorId, input)
    val now = fingerprint(child, hadoopConf)
    val previous = Option(loaded.get(key))
    previous match {
      case Some(before) if now.contains(before.fingerprint) && info.storeVersion > before.storeVersion =>
        Decision(load = false, before.generation)
      case _ =>
        forgetWhenQueriesEnd(child.session.sparkContext)
        val generation = generations.incrementAndGet()
        // A table that cannot be fingerprinted (a file vanished) is loaded in every batch, and never counted unchanged.
        now match {
          case Some(f) => loaded.put(key, Loaded(f, info.storeVersion, generation))
          case None => loaded.remove(key)
        }
        Decision(load = true, generation)
    }
  }

  /** How many stored static tables the driver tracks (of running queries only). */
  def tracked: Int = loaded.size

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

  private def forgetWhenQueriesEnd(sc: SparkContext): Unit = synchronized {
    if (!listeningTo.contains(sc)) {
      sc.addSparkListener(new SparkListener {
        override def onOtherEvent(event: SparkListenerEvent): Unit = event match {
          case ended: StreamingQueryListener.QueryTerminatedEvent =>
            loaded.keySet.removeIf(_.runId == ended.runId)
            StaticCaches.forgetRun(ended.runId)
          case _ =>
        }
      })
      listeningTo = Some(sc)
    }
  }
}
