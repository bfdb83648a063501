package umjoin.spark.core.cost

import scala.collection.mutable

/**
 * Double (Holt) exponential smoothing (dpPick paper 001, 4.3). `alpha` smooths the level, `beta`
 * the trend; `damping` (phi) damps the trend for the match rate, whose trend fades over time.
 */
final case class Smoothing(alpha: Double, beta: Double, damping: Double)

object Forecast {

  /**
   * The next value of `series` (oldest first) by Holt's linear trend method, or with a damped
   * trend when `damping` < 1: level l_t = a*y_t + (1-a)(l_{t-1} + phi*b_{t-1}),
   * trend b_t = b*(l_t - l_{t-1}) + (1-b)*phi*b_{t-1}, forecast l_t + phi*b_t.
   * Starts from l_1 = y_1 and b_1 = y_2 - y_1 (no trend with a single value).
   */
  def next(series: Seq[Double], alpha: Double, beta: Double,
      damping: Double = 1.0): Double = series match {
    case Seq() => Double.NaN
    case Seq(only) => only
    case first +: second +: _ =>
      var level = first
      var trend = second - first
      series.tail.foreach { y =>
        val previous = level
        level = alpha * y + (1 - alpha) * (level + damping * trend)
        trend = beta * (level - previous) + (1 - beta) * damping * trend
      }
      level + damping * trend
  }
}

/**
 * The last `window` cycles' statistics and their forecast for the next cycle: Holt's linear
 * trend for mu and kappa, a damped trend for gamma (clamped to [0, 1]); without smoothing, the
 * last cycle's values (the paper's dpPick_noSmooth).
 */
final class StatisticsHistory(window: Int) extends Serializable {
  private val cycles = mutable.Queue[CycleStatistics]()

  def add(cycle: CycleStatistics): Unit = {
    cycles.enqueue(cycle)
    while (cycles.size > window) cycles.dequeue()
  }

  def isEmpty: Boolean = cycles.isEmpty

  def forecast(smoothing: Option[Smoothing]): CycleStatistics = {
    val pairs = cycles.flatMap(_.matchRate.keys).distinct
    def series(values: CycleStatistics => Option[Double]): Seq[Double] =
      cycles.toSeq.flatMap(values(_))
    def predict(values: Seq[Double], damped: Boolean): Double = smoothing match {
      case Some(s) => Forecast.next(values, s.alpha, s.beta, if (damped) s.damping else 1.0)
      case None => values.last
    }
    val rates = pairs.map(p =>
      p -> math.min(1.0, math.max(0.0, predict(series(_.matchRate.get(p)), damped = true)))).toMap
    val perSuccess = pairs.flatMap { p =>
      val values = series(_.matchesPerSuccess.get(p))
      if (values.isEmpty) None else Some(p -> math.max(1.0, predict(values, damped = false)))
    }.toMap
    val keys = cycles.last.keys.indices.map(i =>
      math.max(0.0, predict(series(c => Some(c.keys(i))), damped = false)))
    CycleStatistics(rates, perSuccess, keys)
  }
}
