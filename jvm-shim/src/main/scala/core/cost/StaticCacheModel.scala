package umjoin.spark.core.cost

import scala.collection.mutable

/**
 * SSBJ's choice (paper 003) of the keys of a static input to keep in memory. A key j of the static
 * (master) side has m(j) rows of `masterRowBytes` each; the stream is expected to bring n(j) rows
 * of `streamRowBytes` each per micro-batch. Kept in the cache, j costs m(j) * v_R bytes; served
 * from the disk-backed store, its stream rows wait for the disk, n(j) * v_S bytes. Theorem 2: cache
 * j iff m(j) * v_R < n(j) * v_S; every key where it costs less gives the least memory (Theorem 1).
 *
 * @param hysteresis s_f >= 1: a key enters when n * v_S > s_f * m * v_R and leaves when
 *                   m * v_R >= s_f * n * v_S, so a key near the balance does not flap (the paper
 *                   finds 1, no hysteresis, best)
 * @param maxBytes   the cache's bound: admitted keys are taken most disk bytes saved per cached
 *                   byte first, whole keys only, while they fit
 */
final case class CacheModel(masterRowBytes: Double, streamRowBytes: Double, hysteresis: Double,
    maxBytes: Long) {
  require(masterRowBytes > 0 && streamRowBytes > 0, "row sizes must be positive")
  require(hysteresis >= 1.0, s"the hysteresis factor is at least 1, not $hysteresis")

  def cacheBytes(key: KeyStatistics[_]): Double = key.masterRows * masterRowBytes
  def diskBytes(key: KeyStatistics[_]): Double = key.streamRows * streamRowBytes

  /** The cache inequality, with hysteresis around the key's present place. */
  def belongsInCache(key: KeyStatistics[_], cachedNow: Boolean): Boolean =
    if (cachedNow) cacheBytes(key) < hysteresis * diskBytes(key)
    else diskBytes(key) > hysteresis * cacheBytes(key)

  /**
   * The keys to cache for the next micro-batch: those the inequality admits, within `maxBytes`.
   * A key with no master rows costs nothing cached (a negative entry) and is admitted once the
   * stream asks for it.
   */
  def choose[K](keys: Iterable[KeyStatistics[K]], cached: K => Boolean): Set[K] = {
    val admitted = keys.filter(k => belongsInCache(k, cached(k.key))).toSeq
    val bySaving =
      admitted.sortBy(k => -(diskBytes(k) / math.max(cacheBytes(k), Double.MinPositiveValue)))
    var used = 0.0
    bySaving.flatMap { k =>
      val cost = cacheBytes(k)
      if (used + cost <= maxBytes) { used += cost; Some(k.key) } else None
    }.toSet
  }

  /** The memory the stream's keys take, each where `cached` puts it (Theorem 1's sum). */
  def memoryBytes[K](keys: Iterable[KeyStatistics[K]], cached: Set[K]): Double =
    keys.iterator.map(k => if (cached(k.key)) cacheBytes(k) else diskBytes(k)).sum
}

/**
 * One key's master rows m(j) (exact, from the static side) and expected stream rows per batch n(j).
 */
final case class KeyStatistics[K](key: K, masterRows: Long, streamRows: Double)

/**
 * n(j): each key's stream rows per micro-batch, smoothed exponentially over the batches seen
 * (n <- alpha * this batch's count + (1 - alpha) * n). A key the stream stops asking for fades and
 * is forgotten below `forgetBelow` rows per batch.
 */
final class StreamRateForecast[K](alpha: Double, forgetBelow: Double = 1e-3) {
  require(alpha > 0 && alpha <= 1, s"the smoothing factor is in (0, 1], not $alpha")
  private val rates = mutable.HashMap[K, Double]()

  def observe(counts: collection.Map[K, Long]): Unit = {
    rates.keys.toSeq.filterNot(counts.contains).foreach { k =>
      val faded = (1 - alpha) * rates(k)
      if (faded < forgetBelow) rates.remove(k) else rates(k) = faded
    }
    counts.foreach { case (k, n) => rates(k) = alpha * n + (1 - alpha) * rates.getOrElse(k, 0.0) }
  }

  def rate(key: K): Double = rates.getOrElse(key, 0.0)
  def keys: collection.Set[K] = rates.keySet
}

/**
 * Which rows of a stored static table an executor keeps in memory between micro-batches
 * (spark.umjoin.staticCache).
 */
sealed trait StaticCacheMode { def name: String }

object StaticCacheMode {
  /** None: every probe reads the store. */
  case object Off extends StaticCacheMode { override val name = "off" }
  /** The keys [[CacheModel]] chooses, learned from the probes of the batches before. */
  case object Ssbj extends StaticCacheMode { override val name = "ssbj" }
  /** Every row, when the partition's rows fit the bound; else none. */
  case object All extends StaticCacheMode { override val name = "all" }

  val byName: Map[String, StaticCacheMode] = Seq(Off, Ssbj, All).map(m => m.name -> m).toMap
}

/**
 * @param maxBytes   the memory of one partition's cache of one static table
 * @param hysteresis the paper's s_f (see [[CacheModel]])
 */
final case class StaticCacheSettings(mode: StaticCacheMode, maxBytes: Long, hysteresis: Double)
