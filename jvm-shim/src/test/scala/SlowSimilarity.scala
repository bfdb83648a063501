package umjoin.spark.testkit

import org.apache.spark.sql.api.java.UDF2

/**
 * A Scala UDF as costly as an image-similarity test (PSP's predicate, paper 004): each call
 * busy-waits `SlowSimilarity.CallMicros`, then answers as [[CountedSimilarity]] does. Register with
 * `spark.udf.registerJavaFunction(name, "umjoin.spark.testkit.SlowSimilarity", BooleanType())`.
 */
final class SlowSimilarity extends UDF2[java.lang.Long, java.lang.Long, java.lang.Boolean] {
  override def call(first: java.lang.Long, last: java.lang.Long): java.lang.Boolean = {
    val until = System.nanoTime() + SlowSimilarity.CallMicros * 1000L
    while (System.nanoTime() < until) {}
    first != Math.floorMod(last + 1, 3L)
  }
}

object SlowSimilarity {
  val CallMicros = 200L
}
