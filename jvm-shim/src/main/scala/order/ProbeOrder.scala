package umjoin.spark.order

import umjoin.spark.planning.JoinGraph

/** Probe-order policies: the order in which a streamed row probes the other inputs' stores. */
object ProbeOrder {

  /**
   * `fixed`: the plan's order. After the streamed input, the leftmost input (in the plan's input
   * order, which follows Spark's join order) that shares a key class with the inputs already bound.
   * Requires a connected join graph, so every step probes by a key.
   */
  def fixed(graph: JoinGraph, streamed: Int): Seq[Int] = {
    require(graph.isConnected, "probe order needs a connected join graph")
    val order = scala.collection.mutable.ArrayBuffer(streamed)
    while (order.size < graph.numInputs) {
      val bound = order.toSet
      order += (0 until graph.numInputs).find(i => !bound.contains(i) && graph.sharedClasses(i, bound).nonEmpty).get
    }
    order.toSeq
  }
}
