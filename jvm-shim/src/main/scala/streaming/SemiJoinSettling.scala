package umjoin.spark.streaming

import scala.collection.mutable

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{JoinedRow, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state.StateStore

import umjoin.spark.core.GeneratedCode
import umjoin.spark.core.probe.StoreIndex
import umjoin.spark.core.store.JoinStore

/**
 * One task's part in the group's semi joins (see [[StageTask]] and [[UnmatchedSpec]]). A
 * combination of a semi join's preserved inputs that no row of its input matched waits: in this
 * task until the stage that settles the join (`job.settleStage`), then in a store of its own,
 * partitioned as the input's store is, until a later row matches it (it goes on, once) or no
 * later row can (it is dropped).
 *
 * @param storedRows an input's rows the batches before stored, through an index
 * @param newRows    an input's rows of this batch in this partition, through an index
 * @param stores     where the stores of the semi joins' waiting combinations are opened for
 *                   writing (each a store of its own)
 */
private[streaming] final class SemiJoinSettling(
    job: MicroBatchJob,
    stage: Int,
    partition: Int,
    metrics: StageMetrics,
    storedRows: (Int, StoreIndex) => JoinStore,
    newRows: (Int, StoreIndex) => JoinStore,
    stores: PartitionStores,
    confs: InputStateConf) {

  // Per semi join's input, new combinations of its preserved inputs that no row of it matched in
  // this task (or, in the stage that settles them, that earlier stages shipped here, or the semi
  // join below let through): they wait for a match in the store that stage writes.
  private val unmatchedHere =
    job.unmatched.map(_.nonPreserved -> mutable.ArrayBuffer[UnsafeRow]()).toMap
  // The semi joins (by their index in job.unmatched) this stage settles, and the combinations the
  // ones below them let through in the stage before, each with the index of the first semi join it
  // is tried on here.
  private val settledHere = job.unmatched.indices.filter(job.settleStage(_) == stage)
  private val passedOn = mutable.ArrayBuffer[(Int, UnsafeRow)]()
  private val opened = mutable.ArrayBuffer[InputStateWriter]()

  private def semiIndex(input: Int): Int = job.unmatched.indexWhere(_.nonPreserved == input)

  /** Whether this stage settles some semi join. */
  def settlesAny: Boolean = settledHere.nonEmpty

  /** A combination no row of semi join input `semi` matched in this task's steps (a copy). */
  def waitFor(semi: Int, combination: UnsafeRow): Unit = unmatchedHere(semi) += combination

  /** Whether a combination waiting for a semi join, or passed on to one, is settled here. */
  def settlesHere(waiting: Shipped.Waiting): Boolean = waiting match {
    case Shipped.PassedOn(_) => true
    case Shipped.Unmatched(semi) => settledHere.contains(semiIndex(semi))
  }

  /** Keeps a combination this stage settles (see [[settlesHere]]) until it settles its join. */
  def keep(waiting: Shipped.Waiting, row: InternalRow): Unit = {
    val kept = row.asInstanceOf[UnsafeRow].copy()
    waiting match {
      case Shipped.PassedOn(semi) => passedOn += ((semiIndex(semi), kept))
      case Shipped.Unmatched(semi) => unmatchedHere(semi) += kept
    }
  }

  /**
   * The waiting combinations of the semi joins a later stage settles, each with its semi join's
   * input: they stay in this partition (their input's store's) until then.
   */
  def settledLater: Iterator[(Int, UnsafeRow)] =
    job.unmatched.indices.filter(job.settleStage(_) > stage).iterator.flatMap { k =>
      val semi = job.unmatched(k).nonPreserved
      unmatchedHere(semi).iterator.map(row => (semi, row))
    }

  private var kept = 0L
  /** The waiting combinations this stage's stores hold, once committed. */
  def rowsKept: Long = kept

  /** The store instances of the waiting combinations this stage settled and committed. */
  def instances: Seq[StateStore] = stores.instances

  /**
   * The waiting combinations of the semi joins this stage settles (in this partition, lowest join
   * first, the ones already stored and this batch's new ones): those a new row of the join's input
   * matches go on to the join above; those no later row can match any more are dropped; the others
   * wait. A combination going on is tried on the rows the joins above stored, up to the last this
   * stage settles (their stores share this partition): it waits at the first none of whose rows
   * matches, or, past them all, comes out or goes on to the next semi join's partition. Returns the
   * result rows, and the combinations going on, each with the index of the semi join they go on to.
   */
  def settle(): (Seq[InternalRow], Seq[(Int, UnsafeRow)]) = {
    val out = mutable.ArrayBuffer[InternalRow]()
    val onward = mutable.ArrayBuffer[(Int, UnsafeRow)]()
    val joined = new JoinedRow
    // Where a combination finds a match: a row of the join's input (stored or new) meeting its
    // condition.
    def finder(u: UnmatchedSpec, rows: JoinStore): InternalRow => Boolean = {
      val keyOf = UnsafeProjection.create(Seq(u.spec.partitionKey), u.spec.output)
      val on = u.onCondition.map(
        GeneratedCode.predicate(_, u.spec.output ++ job.outputs(u.nonPreserved), partition))
      combination =>
        rows.get(keyOf(combination)).exists(row => on.forall(_.eval(joined(combination, row))))
    }
    def matchIndex(k: Int): StoreIndex = StoreIndex.single(job.unmatched(k).spec.partitionClass)
    // A semi join's result reads none of its non-preserved inputs' columns.
    val result =
      job.unmatched.headOption.map(u => UnsafeProjection.create(job.result, u.spec.output))
    val storedMatches = mutable.Map[Int, InternalRow => Boolean]()
    def storedMatch(k: Int): InternalRow => Boolean = storedMatches.getOrElseUpdate(k, {
      val u = job.unmatched(k)
      finder(u, storedRows(u.nonPreserved, matchIndex(k)))
    })
    /** A combination the semi joins below the `a`-th let through. */
    def tryFrom(a: Int, combination: InternalRow): Unit = {
      val here = (a until job.unmatched.size).takeWhile(job.settleStage(_) == stage)
      here.find(b => !storedMatch(b)(combination)) match {
        case Some(b) =>
          unmatchedHere(job.unmatched(b).nonPreserved) += combination.asInstanceOf[UnsafeRow].copy()
        case None if a + here.size < job.unmatched.size =>
          onward += ((a + here.size, combination.asInstanceOf[UnsafeRow].copy()))
        case None => out += result.get(combination).copy()
      }
    }
    passedOn.foreach { case (a, combination) => tryFrom(a, combination) }
    settledHere.foreach { k =>
      val u = job.unmatched(k)
      val writer = InputState.write(u.spec, stores, confs, _ => true)
      opened += writer
      val matched = finder(u, newRows(u.nonPreserved, matchIndex(k)))
      val unmatchable = u.unmatchable.map(GeneratedCode.interpreted(_, u.spec.output, partition))
      // Whether the combination goes: matched now (it goes on), or matched by no later row (it is
      // dropped).
      def goes(combination: InternalRow): Boolean =
        if (matched(combination)) {
          tryFrom(k + 1, combination)
          true
        } else if (unmatchable.exists(_.eval(combination))) {
          metrics.unmatched(u.nonPreserved).gone += 1
          true
        } else false
      metrics.removed += writer.removeWhere((_, combination) => goes(combination))
      // A combination new to the join in this batch that its state watermark rules out: Spark's
      // join does not store it, so no row of this batch (they probe its state) matches it; the
      // stored ones it was tried on did not.
      unmatchedHere(u.nonPreserved).foreach { combination =>
        if (unmatchable.exists(_.eval(combination))) metrics.unmatched(u.nonPreserved).gone += 1
        else if (!goes(combination)) {
          writer.put(combination, job.nowMs)
          metrics.updated += 1
        }
      }
    }
    metrics.numOutputRows += out.size
    (out.toSeq, onward.toSeq)
  }

  /** Commits the stores of the semi joins' waiting combinations this stage settled. */
  def commit(): Unit = {
    stores.commit()
    settledHere.zip(opened).foreach { case (k, writer) =>
      kept += writer.rowCount
      metrics.unmatched(job.unmatched(k).nonPreserved).waiting += writer.rowCount
    }
  }
}
