package umjoin.spark.streaming

import java.util.UUID
import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.atomic.AtomicLong

import scala.collection.concurrent.TrieMap
import scala.collection.mutable

import org.apache.spark.SparkContext
import org.apache.spark.scheduler.{SparkListener, SparkListenerEvent}
import org.apache.spark.sql.streaming.StreamingQueryListener

/**
 * Everything StreamingUMJoins keep between micro-batches outside their checkpoints, in one place.
 *
 * On the driver, per query run ([[StreamingRegistry.Run]]): the rule's notes (each logged once;
 * the ones saying why joins stayed Spark's are what `umjoin.plans.unconverted_streaming_joins`
 * returns), each operator's probe routes and their statistics ([[StreamingRoutes]]), the last
 * load of each stored static table ([[StaticVersions]]), and what the last micro-batch counted of
 * rows placed by an earlier time slicing ([[SliceDrain]]) and of its time slices' costs
 * ([[SliceCosts]]), and whose state each join's checkpoint held when the run started
 * ([[OperatorCheckpoint.WrittenBy]], and the operators Spark's metadata named). When the query
 * terminates (Spark's QueryTerminatedEvent, heard on the driver), its routes, loads and this JVM's
 * static caches go; its notes stay, for the last [[KeptNotes]] runs, so that a stopped query can
 * still be asked why.
 *
 * In every JVM that runs tasks: what it caches of stored static tables ([[StaticCaches]], per run,
 * operator, partition and input; an executor never hears of queries ending, so its caches also go
 * after ten idle minutes) and the rows each store committed ([[CommittedRowCounts]], valid for one
 * version of one store).
 */
object StreamingRegistry {

  /** What the driver keeps for one query run. */
  final class Run {
    /**
     * The rule's messages: (message, whether it says why joins stay as Spark planned them), in the
     * order first seen.
     */
    private[streaming] val notes = mutable.LinkedHashSet[(String, Boolean)]()
    /**
     * Per operator id: the routes of its next micro-batch and the statistics they are chosen from.
     */
    private[streaming] val routes = TrieMap[Long, StreamingRoutes.Entry]()
    /** Per (operator id, input): the last load of a stored static table. */
    private[streaming] val staticLoads = new ConcurrentHashMap[(Long, Int), StaticVersions.Loaded]()
    /**
     * Per (operator id, input): what the last micro-batch counted of the rows an earlier time
     * slicing placed.
     */
    private[streaming] val sliceDrains = new ConcurrentHashMap[(Long, Int), SliceDrain]()
    /** Per operator id: what the last micro-batch measured of its time-sliced stores' costs. */
    private[streaming] val sliceCosts = new ConcurrentHashMap[Long, SliceCosts]()
    /**
     * Per operator id: whose state its checkpoint held when the run first looked (listed once, not
     * every micro-batch).
     */
    private[streaming] val writtenBefore =
      new ConcurrentHashMap[Long, OperatorCheckpoint.WrittenBy]()
    /** The run's first micro-batch and the stateful operators its checkpoint named then. */
    private[streaming] val started =
      new java.util.concurrent.atomic.AtomicReference[(Long, Map[Long, String])]()
  }

  /** Runs whose notes are kept after their query ended. */
  val KeptNotes = 1000

  private val runs = new ConcurrentHashMap[UUID, Run]()
  private val ended = mutable.Queue[UUID]()
  private var listeningTo: Option[SparkContext] = None

  /** Executor side: the static tables' caches, and the stores' committed row counts. */
  private[streaming] val staticCaches = new ConcurrentHashMap[StaticCaches.Key, StaticInputCache]()
  private[streaming] val committedRows =
    new ConcurrentHashMap[CommittedRowCounts.Key, (Long, Long)]()

  /**
   * Numbers no other load of a static table in this driver has: a cache is valid for one load only.
   */
  private val generations = new AtomicLong()
  def nextGeneration(): Long = generations.incrementAndGet()

  /**
   * The driver's entry of query run `runId` (`sc`: the driver's context, whose listener bus says
   * when queries end).
   */
  def run(runId: UUID, sc: SparkContext): Run = {
    listen(sc)
    runs.computeIfAbsent(runId, _ => new Run)
  }

  /**
   * Whether `message` is new for the run: what the rule says is logged once, not every micro-batch.
   */
  def firstNote(runId: UUID, sc: SparkContext, message: String,
      unconverted: Boolean = true): Boolean = {
    val notes = run(runId, sc).notes
    notes.synchronized(notes.add((message, unconverted)))
  }

  /**
   * What stayed as Spark planned it in a query run, and why (the notes logged at INFO), in the
   * order first seen.
   */
  def unconverted(runId: UUID): Seq[String] = Option(runs.get(runId)).toSeq.flatMap { run =>
    run.notes.synchronized(run.notes.toSeq.collect { case (message, true) => message })
  }

  /**
   * What this JVM holds for a query run besides its notes: routes, static tables' loads and caches
   * (none once it ended).
   */
  def heldFor(runId: UUID): Int =
    Option(runs.get(runId)).map(r => r.routes.size + r.staticLoads.size).getOrElse(0) +
      staticCaches.keySet.toArray.count(_.asInstanceOf[StaticCaches.Key].runId == runId)

  private def end(runId: UUID): Unit = {
    Option(runs.get(runId)).foreach { run =>
      run.routes.clear()
      run.staticLoads.clear()
      run.sliceDrains.clear()
      run.sliceCosts.clear()
      run.writtenBefore.clear()
    }
    staticCaches.keySet.removeIf(_.runId == runId)
    ended.synchronized {
      ended.enqueue(runId)
      while (ended.size > KeptNotes) runs.remove(ended.dequeue())
    }
  }

  private def listen(sc: SparkContext): Unit = synchronized {
    if (!listeningTo.contains(sc)) {
      sc.addSparkListener(new SparkListener {
        override def onOtherEvent(event: SparkListenerEvent): Unit = event match {
          case terminated: StreamingQueryListener.QueryTerminatedEvent => end(terminated.runId)
          case _ =>
        }
      })
      listeningTo = Some(sc)
    }
  }
}
