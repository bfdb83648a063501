package umjoin.spark.testkit

import java.util.concurrent.atomic.AtomicLong

import org.apache.spark.sql.api.java.UDF2

/**
 * A Scala UDF standing in for a costly similarity test of two keys (`first != (last + 1) mod 3`),
 * counting its calls in the JVM (local mode: the tasks run there) so that a test can compare them
 * with the combinations a nested loop leaves to it. Register with
 * `spark.udf.registerJavaFunction(name, "umjoin.spark.testkit.CountedSimilarity", BooleanType())`.
 */
final class CountedSimilarity extends UDF2[java.lang.Long, java.lang.Long, java.lang.Boolean] {
  override def call(first: java.lang.Long, last: java.lang.Long): java.lang.Boolean = {
    CountedSimilarity.calls.incrementAndGet()
    first != Math.floorMod(last + 1, 3L)
  }
}

object CountedSimilarity {
  val calls = new AtomicLong()

  /** The calls since the last reset, and resets the count. */
  def takeCalls(): Long = calls.getAndSet(0)
}
