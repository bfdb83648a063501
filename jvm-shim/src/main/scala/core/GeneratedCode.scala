package umjoin.spark.core

import java.util.concurrent.ConcurrentLinkedQueue

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, BasePredicate, BindReferences,
  Expression, Nondeterministic, Predicate, UnsafeProjection}

/**
 * The predicates and projections a UMJoin's tasks generate, kept per executor and handed to the
 * next task that asks for the same expressions over the same input: a task takes an instance no
 * running task holds and gives it back when it ends.
 *
 * Why: Spark caches compiled classes by their code, 100 of them
 * (spark.sql.codegen.cache.maxEntries, fixed when the JVM starts). A multi-way join compiles a
 * condition and a key projection per step of every route, hundreds for a 10-way join, so the cache
 * turns over within every task and each task compiled them all again (half the task time of a
 * 10-way streaming chain). Deterministic expressions only: a nondeterministic one keeps
 * per-partition state.
 */
object GeneratedCode {
  // Bound to their input's ordinals: the same condition planned again in a later micro-batch (new
  // expression ids) finds its code.
  private final case class Key(kind: String, bound: Seq[Expression])

  // Conditions holding a micro-batch's watermark are interpreted (below), not pooled; should other
  // expressions change from batch to batch, the pool forgets the least recently asked for, so that
  // it pins few generated classes (a 10-way chain's routes need about 500 keys). An instance given
  // back to a forgotten key's queue goes with it.
  private val free =
    new LeastRecentlyUsed[Key, ConcurrentLinkedQueue[AnyRef]](maxEntries = 1024)

  /** `condition` over `input`, initialized for `partition`. */
  def predicate(condition: Expression, input: Seq[Attribute], partition: Int): BasePredicate = {
    val bound = BindReferences.bindReference(condition, input)
    val p =
      reused(Key("predicate", Seq(bound)), condition.deterministic, () => Predicate.create(bound))
    p.initialize(partition)
    p
  }

  /**
   * `condition` over `input`, evaluated without generated code: for a condition that holds a
   * micro-batch's watermark (late rows, stored rows to evict, an outer step's padding, a rescan's
   * conditions), which would be new code to compile in every batch and a new key in the pool above.
   * Each is a few comparisons, evaluated as they are: Spark's interpreted predicate, with the
   * session's subexpression elimination, empties a cache of common subexpressions for every row
   * (6 % of a 10-way enrichment chain's samples, more than the comparisons).
   */
  def interpreted(condition: Expression, input: Seq[Attribute], partition: Int): BasePredicate = {
    val p = new Evaluated(BindReferences.bindReference(condition, input))
    p.initialize(partition)
    p
  }

  private final class Evaluated(condition: Expression) extends BasePredicate {
    override def eval(row: InternalRow): Boolean = condition.eval(row).asInstanceOf[Boolean]
    override def initialize(partition: Int): Unit = condition.foreach {
      case n: Nondeterministic => n.initialize(partition)
      case _ =>
    }
  }

  /** `expressions` over `input`, as an UnsafeProjection. */
  def projection(expressions: Seq[Expression], input: Seq[Attribute]): UnsafeProjection = {
    val bound = BindReferences.bindReferences(expressions, input)
    reused(Key("projection", bound), expressions.forall(_.deterministic),
      () => UnsafeProjection.create(bound))
  }

  private def reused[T <: AnyRef](key: Key, shareable: Boolean, create: () => T): T = {
    val context = TaskContext.get()
    if (!shareable || context == null) return create()
    val queue = free.update(key, _.getOrElse(new ConcurrentLinkedQueue[AnyRef]()))
    val instance = Option(queue.poll()).getOrElse(create()).asInstanceOf[T]
    context.addTaskCompletionListener[Unit](_ => queue.offer(instance))
    instance
  }
}
