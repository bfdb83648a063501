package umjoin.spark.core.cost

/**
 * The probe-order policy and its knobs (spark.umjoin.probeOrder, spark.umjoin.dpPick.*). The
 * adaptive policies (all but fixed) gather statistics while probing and choose orders again every
 * cycle: every `cycleRows` streamed rows of a batch task, every `periodMs` of a streaming query
 * (checked between micro-batches), from the forecast of the last `history` cycles.
 */
final case class ProbeOrderSettings(
    policy: ProbeOrderPolicy,
    cycleRows: Long,
    periodMs: Long,
    history: Int,
    smoothing: Option[Smoothing],
    alphaQuery: Double,
    alphaMatch: Double) {
  def adaptive: Boolean = policy != ProbeOrderPolicy.Fixed
  def costModel(structure: StoreStructure): CostModel = CostModel(alphaQuery, alphaMatch, structure)
}
