package umjoin.spark.streaming

import java.util.UUID
import java.util.concurrent.ConcurrentHashMap
import java.util.concurrent.atomic.AtomicReference

import scala.collection.concurrent.TrieMap
import scala.collection.mutable

import org.apache.spark.SparkContext
import org.apache.spark.scheduler.{SparkListener, SparkListenerEvent}
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.streaming.StreamingQueryListener

/**
 * What the StreamingUMJoins of one query run keep on the driver between micro-batches, outside
 * their checkpoints: the planner's notes (each logged once; the ones saying why joins stayed
 * Spark's are what `umjoin.plans.unconverted_streaming_joins` returns), each operator's routes and
 * their statistics ([[StreamingRoutes]]), the last load of each stored static table
 * ([[StaticVersions]]), what the last micro-batch counted of rows placed by an earlier time slicing
 * ([[SliceDrain]]) and of its time slices' costs ([[SliceCosts]]), each operator's layout record
 * and last change of time slicing, the last micro-batch each operator ran, and the operators
 * Spark's metadata of the checkpoint named when the run started.
 *
 * The run owns it (see [[StreamingRun.of]]): it goes with the query, and a restart (a new run)
 * begins anew, as Spark's joins do.
 */
final class StreamingRun(val runId: UUID) {
  /**
   * The planner's messages: (message, whether it says why joins stay as Spark planned them), in the
   * order first seen.
   */
  private val notes = mutable.LinkedHashSet[(String, Boolean)]()
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
   * Per operator id: its layout record's text (None: none yet), read from the checkpoint once per
   * run and kept by the operator when it writes the record, so that planning a micro-batch after
   * the run's first reads no file.
   */
  private[streaming] val layoutRecords = new ConcurrentHashMap[Long, Option[String]]()
  /**
   * Per operator id: the last change of time slicing its checkpoint recorded (the micro-batch and
   * the slicing; None: none), read once per run and kept by the operator when it records one.
   */
  private[streaming] val slicings =
    new ConcurrentHashMap[Long, Option[(Long, IndexedSeq[Option[TimeSlicing]])]]()

  /** Operator `operatorId`'s last change of time slicing: the run's, else `read` (once). */
  def recordedSlicing(operatorId: Long, read: => Option[(Long, IndexedSeq[Option[TimeSlicing]])])
      : Option[(Long, IndexedSeq[Option[TimeSlicing]])] =
    slicings.computeIfAbsent(operatorId, _ => read)
  /**
   * Per operator id: the last micro-batch (its stores' version) it ran in this run: the next
   * micro-batch reads the version it committed.
   */
  private[streaming] val ranVersions = TrieMap[Long, Long]()
  /** The run's first micro-batch and the stateful operators its checkpoint named then. */
  private[streaming] val started = new AtomicReference[(Long, Map[Long, String])]()

  /**
   * Whether `message` is new for the run: what the rule says is logged once, not every micro-batch.
   */
  def firstNote(message: String, unconverted: Boolean = true): Boolean =
    notes.synchronized(notes.add((message, unconverted)))

  /**
   * Drops, when the query ends, what refers to its plans: a static table's load keeps one, and a
   * plan keeps the session the run's entry is keyed by (the rest goes with the query object).
   */
  private def dropPlansAtEnd(sc: SparkContext): Unit = sc.addSparkListener(new SparkListener {
    override def onOtherEvent(event: SparkListenerEvent): Unit = event match {
      case ended: StreamingQueryListener.QueryTerminatedEvent if ended.runId == runId =>
        staticLoads.clear()
        sc.removeSparkListener(this)
      case _ =>
    }
  })

  /**
   * What stayed as Spark planned it in the run, and why (the notes logged at INFO), in the order
   * first seen.
   */
  def unconverted: Seq[String] =
    notes.synchronized(notes.toSeq.collect { case (message, true) => message })
}

object StreamingRun {
  // Spark plans and runs every micro-batch of a query run in one session of the run's own (its
  // StreamExecution's clone of the session that started the query), so the run's entry is keyed
  // by that session, weakly: the entry lives as long as the query does, and no longer.
  private val bySession = new java.util.WeakHashMap[SparkSession, StreamingRun]()

  /** The entry of query run `runId`, whose micro-batches `session` plans. */
  def of(session: SparkSession, runId: UUID): StreamingRun = bySession.synchronized {
    val run = bySession.get(session)
    if (run != null && run.runId == runId) run
    else {
      val started = new StreamingRun(runId)
      started.dropPlansAtEnd(session.sparkContext)
      bySession.put(session, started)
      started
    }
  }

  /** The entry of the query run whose micro-batches `session` plans, if it has one. */
  def existing(session: SparkSession): Option[StreamingRun] =
    bySession.synchronized(Option(bySession.get(session)))
}
